"""PaPE's widened q/k, built term by term as the module doc writes them (zero accumulators,
a and b masked for position-free queries, padding after the concatenation): the streamlined
construction in pape.py must give the same bits in every ablation and dtype. And the
positions PaPE and PaPE-RI build them from: in the layer's dtype, and blind to the
coordinates of tokens without a position."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from pe_bench.adapters import Geometry, build
from pe_bench.adapters.base import AttentionInputs, PositionLayout
from pe_bench.adapters.pape import LOW_PRECISION, PaPEOptions, ParabolicLayer
from pe_bench.harness.attention import Attention

ABLATIONS = [
    dict(zip(("quadratic", "linear", "context", "softplus"), flags, strict=True))
    for flags in itertools.product([True, False], repeat=4)
    if flags[0] or flags[1]  # neither term leaves nothing positional to build
]


def _term_by_term(layer: ParabolicLayer, q, k, inputs: AttentionInputs):
    s_q, s_k = layer._frame(inputs)
    a, b = layer._coefficients_for_queries(inputs, s_q.dtype)
    offset_q, linear_q = torch.zeros_like(s_q[..., :1]), torch.zeros_like(s_q)
    if a is not None:
        offset_q = offset_q + (a * s_q.square()).sum(-1, keepdim=True)
        linear_q = linear_q - 2 * a * s_q
    if b is not None:
        offset_q = offset_q - (b * s_q).sum(-1, keepdim=True)
        linear_q = linear_q + b
    q_parts, k_parts = [offset_q], [torch.ones_like(s_k[..., :1])]
    if a is not None:
        q_parts.append(a)
        k_parts.append(s_k.square())
    q_extra = torch.cat([*q_parts, linear_q], dim=-1)
    k_extra = torch.cat([*k_parts, s_k], dim=-1) * inputs.key.has_pos[:, None, :, None]
    if layer.options.low_precision == "split" and q.dtype in LOW_PRECISION:
        q_hi, k_hi = q_extra.to(q.dtype), k_extra.to(k.dtype)
        q_lo, k_lo = (q_extra - q_hi.float()).to(q.dtype), (k_extra - k_hi.float()).to(k.dtype)
        q_ext, k_ext = torch.cat([q, q_hi, q_hi, q_lo], -1), torch.cat([k, k_hi, k_lo, k_hi], -1)
    else:
        q_ext, k_ext = torch.cat([q, q_extra.to(q.dtype)], -1), torch.cat([k, k_extra.to(k.dtype)], -1)
    pad = -q_ext.shape[-1] % layer.options.pad_to
    return F.pad(q_ext, (0, pad)), F.pad(k_ext, (0, pad))


@pytest.mark.parametrize("shared", [True, False], ids=["grid", "per-sample"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("low_precision", ["split", "round"])
@pytest.mark.parametrize("ablation", ABLATIONS, ids=lambda a: "-".join(k for k, v in a.items() if not v) or "full")
def test_widened_heads_are_the_term_by_term_features(ablation, low_precision, dtype, shared):
    """Also with the grid's positions shared by the batch (stride 0: the features of the
    positions are built for one sample) and stored per sample. float16 too: at this small
    extent every feature is within float16's range, so its balancing scales nothing."""
    torch.manual_seed(0)
    layer = ParabolicLayer(32, 4, 2, PaPEOptions(m=6, low_precision=low_precision, **ablation))
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    layer = layer.to(wide)
    grid = PositionLayout.grid(2, (4, 5), 1, scale=3.7)  # a CLS token, then a scaled 4 x 5 grid
    coords = grid.coords[:1].to(wide).expand(2, -1, -1)
    layout = grid.with_coords(coords if shared else coords.contiguous())
    assert (layout.coords.stride(0) == 0) == shared
    x = torch.randn(2, 21, 32, dtype=wide)
    inputs = AttentionInputs(x_q=x, x_k=x, query=layout, key=layout)
    q, k = (torch.randn(2, 4, 21, 8).to(dtype) for _ in range(2))
    # 16 bits under autocast, as training runs: a and b come out of W_ab in 16 bits
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype in LOW_PRECISION):
        got, expected = layer.transform_qk(q, k, inputs), _term_by_term(layer, q, k, inputs)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and torch.equal(g, e)


#: every form whose positions pass through the frames (efficient, position space, explicit, tiles)
POSITION_FORMS = [
    ("pape", {"m": 6}),
    ("pape", {"m": 6, "space": "position"}),
    ("pape", {"m": 6, "form": "explicit"}),
    ("pape", {"m": 6, "form": "explicit", "space": "position"}),
    ("pape", {"m": 6, "frame_tile": 2}),
    ("pape-ri", {}),
    ("pape-ri", {"form": "explicit"}),
    ("pape-ri", {"frame_tile": 2}),
]


@pytest.mark.parametrize(("method", "options"), POSITION_FORMS, ids=lambda v: v if isinstance(v, str) else str(v))
def test_tokens_without_a_position_may_hold_any_coordinates(method, options):
    """``PositionLayout``: entries of tokens without a position are ignored. A NaN in a CLS
    token's coordinates and an inf in a position-free token mid-sequence used to reach every
    output (each such token's positional terms were multiplied by a zero flag, and NaN * 0 is
    NaN); now the output and every gradient are those with zeros there, bit for bit."""
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=(4, 4), num_prefix_tokens=1)
    layer = Attention(32, 4, build(method, geometry, 32, 4, 1, options).make_layer(0))
    grid = PositionLayout.grid(2, (4, 4), 1)
    has_pos = grid.has_pos.clone()
    has_pos[:, 6] = False  # a position-free token among the grid's
    clean = grid.coords.clone()
    clean[:, 6] = 0.0
    stray = clean.clone()
    stray[:, 0], stray[:, 6] = float("nan"), float("inf")
    x = torch.randn(2, 17, 32)
    results = []
    for coords in (clean, stray):
        layer.zero_grad()
        x_ = x.clone().requires_grad_()
        out = layer(x_, PositionLayout(coords, has_pos, None, grid.grid_shape))
        out.sum().backward()
        results.append([out.detach(), x_.grad] + [p.grad for p in layer.parameters() if p.grad is not None])
    assert bool(torch.isfinite(results[0][0]).all())
    for with_zeros, with_stray in zip(*results, strict=True):
        assert torch.equal(with_zeros, with_stray)


def test_pape_ri_frames_follow_a_float64_layer_fed_float32_positions():
    """A float64 PaPE-RI layer (a reference run) fed a float32 grid builds its efficient
    features in float64, as PaPE does (``frame_dtype``): efficient and explicit logits agree
    to float64 rounding (they were 3.4e-4 apart with float32 features, positions 1000 from the
    origin)."""
    geometry = Geometry(pos_dim=2, grid_shape=(6, 6), num_prefix_tokens=1)
    grid = PositionLayout.grid(2, (6, 6), 1, scale=37.3)
    layout = grid.with_coords(grid.coords + 1000.0)
    assert layout.coords.dtype == torch.float32
    layers = []
    for form in ("efficient", "explicit"):
        torch.manual_seed(0)
        encoding = build("pape-ri", geometry, 32, 4, 1, {"wp_init": "geometric", "form": form})
        layers.append(Attention(32, 4, encoding.make_layer(0)).double())
    x = torch.randn(2, 37, 32, dtype=torch.float64)
    with torch.no_grad():
        efficient, explicit = (layer.logits(x, layout) for layer in layers)
    finite = torch.isfinite(explicit)
    assert efficient.dtype == torch.float64
    assert float((efficient[finite] - explicit[finite]).abs().max()) < 1e-8
