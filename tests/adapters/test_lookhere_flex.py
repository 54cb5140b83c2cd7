"""LookHere's FlexAttention form: its score_mod, evaluated pair by pair, is the dense bias
(distance decay and -inf outside each head's field of view) for every variant, with CLS,
padding, interpolated positions, cross-attention and causality; and it never builds an
N x N tensor. Whole-layer outputs of the Flex path against the dense path are compared in
tests/harness/test_flex_attention.py."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import AttentionInputs, Geometry, PositionLayout, build
from pe_bench.harness.attention import Attention, attention_kernel

#: (heads, options): the three released variants at ViT-B's 12 heads (directed + unmasked
#: groups), 16 heads (a group with a second cycle and slopes 1/4), and two custom layouts.
VARIANTS = [
    (12, {}),
    (12, {"variant": "lh180"}),
    (12, {"variant": "lh45"}),
    (16, {}),
    (6, {"variant": "custom", "head_groups": ["corners", "none"]}),
    (5, {"variant": "custom", "head_groups": ["triangles", "eighths2", "halves"], "layer_slopes": [1.0, 0.25]}),
]


def lookhere_layer(heads: int, options: dict, dtype: torch.dtype, layer: int = 1):
    geometry = Geometry(pos_dim=2, grid_shape=(4, 5), num_prefix_tokens=1)
    return build("lookhere", geometry, 8 * heads, heads, depth=3, options=options).make_layer(layer).to(dtype)


def score_mod_table(score_mod, batch: int, heads: int, n_q: int, n_k: int, dtype: torch.dtype) -> torch.Tensor:
    """The score_mod evaluated on broadcast (b, h, i, j) index tensors with zero scores: the
    bias it adds, as a (B, H, Nq, Nk) table to hold against the dense ``bias``."""
    b = torch.arange(batch)[:, None, None, None]
    h = torch.arange(heads)[None, :, None, None]
    i = torch.arange(n_q)[None, None, :, None]
    j = torch.arange(n_k)[None, None, None, :]
    return score_mod(torch.zeros((), dtype=dtype), b, h, i, j).expand(batch, heads, n_q, n_k)


def grid_layout(grid, prefix: int, dtype: torch.dtype, scale: float = 1.0, padding: int = 0) -> PositionLayout:
    """Two samples on ``grid`` after ``prefix`` CLS tokens; the second sample's last
    ``padding`` tokens are padding, moved off the grid (to row 9) so that the directed heads
    of those rows see no valid key and the drop rule is exercised."""
    layout = PositionLayout.grid(2, grid, prefix, scale=scale)
    coords = layout.coords.to(dtype).clone()
    valid = None
    if padding:
        valid = torch.ones(coords.shape[:2], dtype=torch.bool)
        valid[1, -padding:] = False
        coords[1, -padding:, 0] = 9.0
    return PositionLayout(coords=coords, has_pos=layout.has_pos, valid=valid, grid_shape=layout.grid_shape)


def inputs_of(query: PositionLayout, key: PositionLayout | None = None, causal: bool = False) -> AttentionInputs:
    key = query if key is None else key
    x_q, x_k = torch.zeros(2, query.coords.shape[1], 8), torch.zeros(2, key.coords.shape[1], 8)
    return AttentionInputs(x_q=x_q, x_k=x_k, query=query, key=key, causal=causal)


def assert_score_mod_is_the_bias(layer, inputs: AttentionInputs, dtype: torch.dtype) -> torch.Tensor:
    dense = layer.bias(None, None, inputs)
    heads, (batch, n_q), n_k = layer.slopes.shape[0], inputs.query.coords.shape[:2], inputs.key.coords.shape[1]
    flex = score_mod_table(layer.score_mod(None, None, inputs), batch, heads, n_q, n_k, dtype)
    assert flex.dtype == dense.dtype == dtype
    assert torch.equal(torch.isinf(flex), torch.isinf(dense)), "the fields of view differ"
    torch.testing.assert_close(flex, dense, rtol=0, atol=0)
    return dense


@pytest.mark.parametrize(("heads", "options"), VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(("prefix", "padding"), [(0, 0), (1, 0), (1, 6), (0, 6)], ids=["bare", "cls", "cls+pad", "pad"])
def test_score_mod_equals_the_dense_bias(heads, options, dtype, prefix, padding):
    layer = lookhere_layer(heads, options, dtype)
    dense = assert_score_mod_is_the_bias(layer, inputs_of(grid_layout((4, 5), prefix, dtype, padding=padding)), dtype)
    # The comparison has teeth: directed heads mask keys, and every row keeps a finite key.
    assert torch.isinf(dense).any()
    assert torch.isfinite(dense).any(-1).all()
    if padding:  # a padding row off the grid drops its mask (module doc), so it stays finite
        assert torch.isfinite(dense[1, :, -1]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_interpolated_positions_keep_boundary_keys_alike(dtype):
    """Scaled positions put keys on the diagonal and axis boundaries up to round-off: both
    forms decide them with the same slack."""
    for heads, options in VARIANTS[:3]:
        layer = lookhere_layer(heads, options, dtype, layer=0)
        assert_score_mod_is_the_bias(layer, inputs_of(grid_layout((5, 5), 1, dtype, scale=0.4375)), dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cross_attention_rows_that_see_nothing_drop_their_mask_alike(causal):
    """Queries on a grid beyond the keys' (rows 3.. against keys in rows 0..2): the
    down-looking heads of the lowest queries see no key, so those rows lose their direction
    mask; the score_mod finds them without an N x N pass, chunk by chunk."""
    layer = lookhere_layer(12, {}, torch.float64)
    query = grid_layout((3, 3), 1, torch.float64)
    query.coords = query.coords + torch.tensor([2.0, 1.0], dtype=torch.float64)
    key = grid_layout((3, 4), 0, torch.float64, padding=3)
    inputs = inputs_of(query, key, causal)
    dense = assert_score_mod_is_the_bias(layer, inputs, torch.float64)
    dropped = layer.unmasked_rows(inputs)
    assert dropped.shape == (2, 12, 10)
    assert dropped.any() and not dropped.all()
    assert torch.isfinite(dense[dropped]).all()


def test_chunked_blind_rows_equal_the_dense_ones(monkeypatch):
    """The chunked pass over the keys (here one query row per chunk) finds the rows the
    dense field of view does."""
    import pe_bench.adapters.lookhere as lookhere

    layer = lookhere_layer(12, {"variant": "lh45"}, torch.float32)
    query = grid_layout((4, 4), 1, torch.float32, scale=1.5)
    inputs = inputs_of(query, grid_layout((3, 5), 0, torch.float32, padding=4))
    whole = layer.unmasked_rows(inputs)
    monkeypatch.setattr(lookhere, "_CHUNK_ELEMENTS", 1)
    assert torch.equal(layer.unmasked_rows(inputs), whole)
    assert whole.any()


def test_self_attention_score_mod_builds_nothing_quadratic(monkeypatch):
    """Self-attention needs no pass over the keys: building the score_mod never calls the
    dense field of view."""
    layer = lookhere_layer(12, {}, torch.float32)
    monkeypatch.setattr(type(layer), "visibility", lambda *a: pytest.fail("N x N field of view built"))
    layer.score_mod(None, None, inputs_of(grid_layout((4, 5), 1, torch.float32, padding=6)))


@pytest.mark.parametrize("padding", [0, 6], ids=["full", "padded"])
def test_flex_rows_without_cls_never_empty(padding):
    """Without CLS, padding rows off the grid would see no valid key in their directed heads;
    the drop rule keeps Flex's output finite and equal to the dense path on every row."""
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=(4, 5))
    encoding = build("lookhere", geometry, 96, 12, depth=1)
    layer = Attention(96, 12, encoding.make_layer(0)).double().eval()
    layout = grid_layout((4, 5), 0, torch.float64, padding=padding)
    x = torch.randn(2, 20, 96, dtype=torch.float64)
    outs = {}
    for kernel in ("dense", "flex"):
        with torch.no_grad(), attention_kernel(kernel):
            outs[kernel] = layer(x, layout)
    assert torch.isfinite(outs["flex"]).all()
    torch.testing.assert_close(outs["flex"], outs["dense"], atol=1e-12, rtol=1e-12)
