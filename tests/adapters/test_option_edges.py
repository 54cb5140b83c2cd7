"""Options at the edges of their ranges: each builds what it says, or is refused with its name."""

from __future__ import annotations

import pydantic
import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, Principle, build
from pe_bench.harness.blocks import TransformerEncoder

DIM, HEADS, DEPTH = 32, 4, 2
GRID = Geometry(pos_dim=2, grid_shape=(4, 4), num_prefix_tokens=1)

#: The parameters each encoding's ``init_std`` initialises.
INITIALISED = {
    "abspos": ("encoding.table",),
    "cope": ("pos_emb",),
    "sape2": ("emb_x", "emb_y"),
    "wepe": ("encoding.cls_embed",),
}


@pytest.mark.parametrize("name", sorted(INITIALISED))
def test_zero_init_std_starts_at_zero(name: str) -> None:
    """``init_std: 0`` (allowed by the options, ``ge=0``) used to divide by zero in
    ``nn.init.trunc_normal_``; it is a zero initialisation."""
    model = TransformerEncoder(DIM, DEPTH, HEADS, build(name, GRID, DIM, HEADS, DEPTH, {"init_std": 0.0}))
    named = dict(model.named_parameters())
    chosen = [key for key in named if any(key == n or key.endswith("." + n) for n in INITIALISED[name])]
    assert chosen, f"no parameter named {INITIALISED[name]} in {sorted(named)}"
    assert all(torch.count_nonzero(named[key]) == 0 for key in chosen)
    layout = PositionLayout.grid(2, GRID.grid_shape, num_prefix_tokens=1)
    out = model(torch.randn(2, 17, DIM), layout)
    assert out.shape == (2, 17, DIM) and torch.isfinite(out).all()


def test_default_init_std_is_not_zero() -> None:
    model = TransformerEncoder(DIM, DEPTH, HEADS, build("abspos", GRID, DIM, HEADS, DEPTH))
    assert 0.01 < model.encoding.table.std().item() < 0.03


@pytest.mark.parametrize("slopes", [(-0.5, 1.0), (1.5, -0.1)])
def test_lookhere_refuses_negative_layer_slopes(slopes: tuple[float, float]) -> None:
    """A negative s_l makes that layer's logits grow with distance, while the encoding claims decay."""
    with pytest.raises(pydantic.ValidationError, match="layer_slopes"):
        build("lookhere", GRID, DIM, HEADS, DEPTH, {"layer_slopes": slopes})


def test_lookhere_zero_slope_drops_the_decay_claim() -> None:
    encoding = build("lookhere", GRID, DIM, HEADS, DEPTH, {"layer_slopes": (1.0, 0.0)})
    assert Principle.DISTANCE_DECAY not in encoding.claimed_principles()


@pytest.mark.parametrize(("pos_dim", "m", "decays"), [(3, 2, False), (3, 3, True), (2, 2, True), (2, 1, False)])
def test_pape_claims_decay_only_when_w_p_has_no_null_space(pos_dim: int, m: int, decays: bool) -> None:
    """W_p (m x P) with m < P leaves offsets along its null space without any decay: conformance
    measured pape[m=2] on 3-D points at -0.49, while it claimed decay."""
    encoding = build("pape", Geometry(pos_dim=pos_dim), DIM, HEADS, DEPTH, {"m": m})
    assert (Principle.DISTANCE_DECAY in encoding.claimed_principles()) is decays
    identity = build("pape", Geometry(pos_dim=pos_dim), DIM, HEADS, DEPTH, {"m": m, "project": False})
    assert Principle.DISTANCE_DECAY in identity.claimed_principles()  # W_p = I: m is P
