"""LookHere: field-of-view masks per head direction, slopes, CLS, padding, extrapolation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import AttentionInputs, Geometry, PositionLayout, Principle, build
from pe_bench.adapters.lookhere import direction_order
from pe_bench.harness.attention import Attention
from pe_bench.harness.blocks import TransformerEncoder

DIM, HEADS = 32, 4


def make(heads: int = HEADS, depth: int = 3, grid=(5, 5), **options):
    geometry = Geometry(pos_dim=2, grid_shape=grid, num_prefix_tokens=1)
    return build("lookhere", geometry, heads * 8, heads, depth, options)


def layer_bias(enc, layer: int, layout: PositionLayout) -> torch.Tensor:
    n = layout.coords.shape[1]
    x = torch.zeros(layout.coords.shape[0], n, enc.dim)
    inputs = AttentionInputs(x_q=x, x_k=x, query=layout, key=layout)
    return enc.make_layer(layer).bias(None, None, inputs)


def centre_view(bias: torch.Tensor, head: int) -> set[tuple[int, int]]:
    """Offsets (d_row, d_col) visible from the centre of a 5x5 grid (no prefix tokens)."""
    row = bias[0, head, 12]
    return {(j // 5 - 2, j % 5 - 2) for j in range(25) if torch.isfinite(row[j])}


ALL = {(dr, dc) for dr in range(-2, 3) for dc in range(-2, 3)}


def test_halves_fov_180() -> None:
    enc = make(fov_degrees=180)
    bias = layer_bias(enc, 0, PositionLayout.grid(1, (5, 5)))
    # Four directions handed out right, left, up, down (bit-reversal order of 0, 90, 180, 270).
    assert centre_view(bias, 0) == {o for o in ALL if o[1] >= 0}  # right: col >= own col
    assert centre_view(bias, 1) == {o for o in ALL if o[1] <= 0}  # left
    assert centre_view(bias, 2) == {o for o in ALL if o[0] <= 0}  # up: row <= own row
    assert centre_view(bias, 3) == {o for o in ALL if o[0] >= 0}  # down


def test_triangles_fov_90_include_diagonals() -> None:
    enc = make(fov_degrees=90)
    bias = layer_bias(enc, 0, PositionLayout.grid(1, (5, 5)))
    assert centre_view(bias, 0) == {(dr, dc) for dr, dc in ALL if abs(dr) <= dc}  # right
    assert centre_view(bias, 2) == {(dr, dc) for dr, dc in ALL if abs(dc) <= -dr}  # up


def test_eighths_fov_45() -> None:
    enc = make(heads=8, fov_degrees=45)
    layer = enc.make_layer(0)
    assert layer.direction_angles_degrees == pytest.approx([22.5, 202.5, 112.5, 292.5, 67.5, 247.5, 157.5, 337.5])
    bias = layer_bias(enc, 0, PositionLayout.grid(1, (5, 5)))
    # 22.5 deg: the wedge between "right" and the up-right diagonal, both rays included.
    assert centre_view(bias, 0) == {(dr, dc) for dr, dc in ALL if 0 <= -dr <= dc}
    union = set().union(*(centre_view(bias, h) for h in range(8)))
    assert union == ALL  # eight wedges tile the plane


@settings(max_examples=60, deadline=None)
@given(
    dr=st.integers(-6, 6),
    dc=st.integers(-6, 6),
    fov=st.sampled_from([45.0, 90.0, 180.0]),
    head=st.integers(0, 7),
)
def test_mask_is_the_angular_cone(dr: int, dc: int, fov: float, head: int) -> None:
    enc = make(heads=8, fov_degrees=fov)
    layer = enc.make_layer(0)
    coords = torch.tensor([[[6.0, 6.0], [6.0 + dr, 6.0 + dc]]])
    layout = PositionLayout(coords=coords, has_pos=torch.ones(1, 2, dtype=torch.bool), grid_shape=(13, 13))
    x = torch.zeros(1, 2, enc.dim)
    bias = layer.bias(None, None, AttentionInputs(x_q=x, x_k=x, query=layout, key=layout))
    centre = math.radians(layer.direction_angles_degrees[head])
    if dr == 0 and dc == 0:
        inside = True
    else:
        angle = math.atan2(-dr, dc)  # "up" is -row
        gap = abs((angle - centre + math.pi) % (2 * math.pi) - math.pi)
        inside = gap <= math.radians(fov / 2) + 1e-9
    assert bool(torch.isfinite(bias[0, head, 0, 1])) == inside


def test_slopes_per_head_and_layer() -> None:
    enc = make(heads=8, depth=3, fov_degrees=90, global_slope=2.0)
    layout = PositionLayout.grid(1, (5, 5))
    dist = torch.cdist(layout.coords[0], layout.coords[0])
    for layer, layer_slope in enumerate([1.5, 1.0, 0.5]):  # linear decay across depth
        bias = layer_bias(enc, layer, layout)
        for head in range(8):
            head_slope = 0.5 if head < 4 else 0.25  # halves per cycle of 4 directions
            finite = torch.isfinite(bias[0, head])
            expected = -2.0 * layer_slope * head_slope * dist
            torch.testing.assert_close(bias[0, head][finite], expected[finite])


def test_cls_unbiased_unmasked_and_self_always_visible() -> None:
    enc = make(fov_degrees=45, heads=8)
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=1)
    bias = layer_bias(enc, 1, layout)
    assert torch.equal(bias[:, :, 0, :], torch.zeros_like(bias[:, :, 0, :]))
    assert torch.equal(bias[:, :, :, 0], torch.zeros_like(bias[:, :, :, 0]))
    assert torch.equal(bias.diagonal(dim1=-2, dim2=-1), torch.zeros(2, 8, 17))


def test_padding_changes_nothing_and_larger_grid_runs() -> None:
    torch.manual_seed(0)
    enc = make(grid=(4, 4))
    model = TransformerEncoder(DIM, 3, HEADS, enc).eval()
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=1)
    x = torch.randn(2, 17, DIM)
    out = model(x, layout)
    pad = 5
    padded = PositionLayout(
        coords=torch.cat([layout.coords, torch.full((2, pad, 2), 7.0)], 1),
        has_pos=torch.cat([layout.has_pos, torch.ones(2, pad, dtype=torch.bool)], 1),
        valid=torch.cat([torch.ones(2, 17, dtype=torch.bool), torch.zeros(2, pad, dtype=torch.bool)], 1),
        grid_shape=(4, 4),
    )
    out_padded = model(torch.cat([x, torch.randn(2, pad, DIM)], 1), padded)
    torch.testing.assert_close(out_padded[:, :17], out, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out_padded).all()

    big = PositionLayout.grid(2, (9, 7), num_prefix_tokens=1)
    out_big = model(torch.randn(2, 64, DIM, requires_grad=True), big)
    out_big.sum().backward()
    assert torch.isfinite(out_big).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert list(enc.parameters()) == []  # fixed slopes and masks: nothing to learn


def test_translation_invariant_logits_and_claims() -> None:
    torch.manual_seed(1)
    enc = make()
    attn = Attention(DIM, HEADS, enc.make_layer(0))
    layout = PositionLayout.grid(1, (4, 4), num_prefix_tokens=1)
    x = torch.randn(1, 17, DIM)
    shifted = layout.with_coords(layout.coords + torch.tensor([3.0, -5.0]))
    torch.testing.assert_close(attn.logits(x, shifted), attn.logits(x, layout))
    assert enc.claimed_principles() == {
        Principle.TRANSLATION_INVARIANCE,
        Principle.DISTANCE_DECAY,
        Principle.DIRECTIONALITY,
    }


def test_direction_order() -> None:
    assert direction_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert direction_order(3) == [0, 1, 2]
