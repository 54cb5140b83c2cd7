"""LookHere (arXiv 2405.13985), as released: LH-180/90/45 masks and slopes by hand, head counts, CLS, padding."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import AttentionInputs, Geometry, PositionLayout, Principle, build
from pe_bench.adapters.lookhere import heads_per_group
from pe_bench.harness.attention import Attention
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.conformance.probes import with_padding

DIM, HEADS = 32, 4


def make(heads: int = HEADS, depth: int = 3, grid=(5, 5), **options):
    geometry = Geometry(pos_dim=2, grid_shape=grid, num_prefix_tokens=1)
    return build("lookhere", geometry, heads * 8, heads, depth, options)


def layer_bias(enc, layer: int, layout: PositionLayout) -> torch.Tensor:
    n = layout.coords.shape[1]
    x = torch.zeros(layout.coords.shape[0], n, enc.dim)
    inputs = AttentionInputs(x_q=x, x_k=x, query=layout, key=layout)
    return enc.make_layer(layer).bias(None, None, inputs)


# Expected fields of view, written by hand from the release's masks (GreenCUBIC/lookhere,
# create_lh_layer_tensor) on a 3 x 3 grid: one 3-row picture per head, top row first,
# "#" = key visible from the query, "." = masked. Heads in the release's order.
CENTRE_VIEWS = {
    "lh90": [
        ("##.", "##.", "..."),  # corners: up-left quadrant, axes included
        (".##", ".##", "..."),  # up-right
        ("...", "##.", "##."),  # down-left
        ("...", ".##", ".##"),  # down-right
        ("###", ".#.", "..."),  # triangles: up, diagonals included
        ("...", ".#.", "###"),  # down
        ("#..", "##.", "#.."),  # left
        ("..#", ".##", "..#"),  # right
        ("###", "###", "###"),  # none x 4
        ("###", "###", "###"),
        ("###", "###", "###"),
        ("###", "###", "###"),
    ],
    "lh180": [
        ("###", "###", "..."),  # halves: up, own row included
        ("...", "###", "###"),  # down
        ("##.", "##.", "##."),  # left
        (".##", ".##", ".##"),  # right
        ("###", ".##", "..#"),  # diagonals: up-right, anti-diagonal through the query included
        ("###", "##.", "#.."),  # up-left
        ("..#", ".##", "###"),  # down-right
        ("#..", "##.", "###"),  # down-left
        ("###", "###", "###"),  # none x 4
        ("###", "###", "###"),
        ("###", "###", "###"),
        ("###", "###", "###"),
    ],
    "lh45": [
        ("##.", ".#.", "..."),  # eighths1: up-triangle & left
        ("...", ".#.", "##."),  # down-triangle & left
        ("#..", "##.", "..."),  # left-triangle & up
        ("..#", ".##", "..."),  # right-triangle & up
        (".##", ".#.", "..."),  # eighths2: up-triangle & right
        ("...", ".#.", ".##"),  # down-triangle & right
        ("...", "##.", "#.."),  # left-triangle & down
        ("...", ".##", "..#"),  # right-triangle & down
        ("###", "###", "###"),  # none x 4
        ("###", "###", "###"),
        ("###", "###", "###"),
        ("###", "###", "###"),
    ],
}

# LH-90 from the top-left corner (row 0, col 0) of the 3 x 3 grid: boundaries included.
CORNER_VIEWS_LH90 = [
    ("#..", "...", "..."),  # up-left quadrant: only itself
    ("###", "...", "..."),  # up-right: its own row
    ("#..", "#..", "#.."),  # down-left: its own column
    ("###", "###", "###"),  # down-right: everything
    ("#..", "...", "..."),  # up triangle: only itself
    ("#..", "##.", "###"),  # down triangle: |d_col| <= d_row
    ("#..", "...", "..."),  # left triangle: only itself
    ("###", ".##", "..#"),  # right triangle: |d_row| <= d_col
] + [("###", "###", "###")] * 4


def views(bias: torch.Tensor, query: int) -> list[tuple[str, ...]]:
    """Per head, the 3 x 3 picture of keys visible from ``query`` (no prefix tokens)."""
    pictures = []
    for head in range(bias.shape[1]):
        seen = torch.isfinite(bias[0, head, query]).tolist()
        pictures.append(tuple("".join("#" if seen[3 * r + c] else "." for c in range(3)) for r in range(3)))
    return pictures


@pytest.mark.parametrize("variant", ["lh90", "lh180", "lh45"])
def test_released_fields_of_view_by_hand(variant: str) -> None:
    enc = make(heads=12, grid=(3, 3), variant=variant)
    bias = layer_bias(enc, 0, PositionLayout.grid(1, (3, 3)))
    assert views(bias, 4) == CENTRE_VIEWS[variant]
    if variant == "lh90":
        assert views(bias, 0) == CORNER_VIEWS_LH90


def test_lh90_is_the_default_and_its_bias_values_by_hand() -> None:
    """B = -g s_l m_h ||d||: g = 2, s_l = 1.5, 1.0, 0.5 over 3 layers, m_h = 1/2 for the 8
    directed heads and 1/4, 1/16, 1/64, 1/256 for the 4 unmasked ones."""
    enc = make(heads=12, grid=(3, 3))
    assert enc.options.variant == "lh90"
    layout = PositionLayout.grid(1, (3, 3))
    biases = [layer_bias(enc, layer, layout)[0] for layer in range(3)]
    r5, r2 = math.sqrt(5.0), math.sqrt(2.0)
    expected = [
        # (layer, head, query, key, bias); cells are row * 3 + col, query 0 = (0, 0)
        (0, 3, 0, 7, -2 * 1.5 * 0.5 * r5),  # down-right quadrant sees (2, 1)
        (0, 5, 0, 7, -2 * 1.5 * 0.5 * r5),  # down triangle sees (2, 1): |1| <= 2
        (0, 7, 0, 7, -math.inf),  # right triangle does not: |2| > 1
        (0, 0, 0, 7, -math.inf),  # up-left quadrant does not
        (0, 8, 0, 7, -2 * 1.5 * 0.25 * r5),
        (1, 9, 0, 7, -2 * 1.0 * 0.0625 * r5),
        (2, 10, 0, 7, -2 * 0.5 * 0.015625 * r5),
        (2, 11, 0, 7, -2 * 0.5 * 0.00390625 * r5),
        (1, 1, 4, 2, -2 * 1.0 * 0.5 * r2),  # up-right quadrant: centre -> (0, 2), on its diagonal
        (1, 4, 4, 2, -2 * 1.0 * 0.5 * r2),  # up triangle: the diagonal is a boundary, inside
        (2, 7, 4, 5, -2 * 0.5 * 0.5 * 1.0),  # right triangle: one step right
        (0, 6, 4, 5, -math.inf),  # left triangle: one step right is masked
        (0, 2, 4, 4, 0.0),  # the query itself: visible to every head, distance 0
        (0, 9, 4, 4, 0.0),
    ]
    for layer, head, query, key, value in expected:
        assert biases[layer][head, query, key].item() == pytest.approx(value), (layer, head, query, key)


def test_heads_dealt_to_groups_in_cycles_of_four() -> None:
    # Three groups: the release's 12 (4, 4, 4) and 16 (8, 4, 4); two groups: 12 (8, 4), 6 (4, 2).
    assert heads_per_group(3, 12) == [4, 4, 4]
    assert heads_per_group(3, 16) == [8, 4, 4]
    assert heads_per_group(2, 12) == [8, 4]
    assert heads_per_group(2, 6) == [4, 2]
    # Beyond the release: whole cycles in turn, the remainder to the next group.
    assert heads_per_group(3, 24) == [8, 8, 8]
    assert heads_per_group(3, 4) == [4, 0, 0]
    assert heads_per_group(3, 5) == [4, 1, 0]
    assert heads_per_group(3, 14) == [6, 4, 4]


def test_four_heads_are_the_four_quadrants_and_five_add_the_up_triangle() -> None:
    enc = make(heads=4, grid=(3, 3))  # pe-bench's tiny models: 4 heads
    assert views(layer_bias(enc, 0, PositionLayout.grid(1, (3, 3))), 4) == CENTRE_VIEWS["lh90"][:4]
    torch.testing.assert_close(enc.make_layer(0).slopes, torch.full((4,), 2 * 1.5 * 0.5))
    five = make(heads=5, grid=(3, 3))
    assert views(layer_bias(five, 0, PositionLayout.grid(1, (3, 3))), 4) == CENTRE_VIEWS["lh90"][:5]


def test_slopes_of_larger_and_partial_groups() -> None:
    # 16 heads, LH-90: corners take two cycles (1/2 then 1/4), triangles 1/2, none 1/4 .. 1/256.
    enc = make(heads=16, depth=1)
    corners = [0.5] * 4 + [0.25] * 4
    expected = [2 * 1.5 * m for m in corners + [0.5] * 4 + [1 / 4, 1 / 16, 1 / 64, 1 / 256]]
    torch.testing.assert_close(enc.make_layer(0).slopes, torch.tensor(expected))
    # 6 heads, custom corners-none: the release's two-head "none" slopes 1/4, 1/16.
    six = make(heads=6, depth=1, variant="custom", head_groups=["corners", "none"], global_slope=1.0)
    torch.testing.assert_close(six.make_layer(0).slopes, 1.5 * torch.tensor([0.5] * 4 + [1 / 4, 1 / 16]))
    # 24 heads, none group of 8: each of the four slopes twice (the release's np.repeat).
    big = make(heads=24, depth=1, global_slope=1.0)
    none = [1 / 4, 1 / 4, 1 / 16, 1 / 16, 1 / 64, 1 / 64, 1 / 256, 1 / 256]
    torch.testing.assert_close(big.make_layer(0).slopes[16:], 1.5 * torch.tensor(none))


# Field of view of each head as an angular cone (centre, half-angle) in degrees,
# counter-clockwise from "right" with "up" = -row: an oracle independent of the normals.
CONES = {
    "lh90": [(135, 45), (45, 45), (225, 45), (315, 45), (90, 45), (270, 45), (180, 45), (0, 45)],
    "lh180": [(90, 90), (270, 90), (180, 90), (0, 90), (45, 90), (135, 90), (315, 90), (225, 90)],
    "lh45": [(112.5, 22.5), (247.5, 22.5), (157.5, 22.5), (22.5, 22.5)]
    + [(67.5, 22.5), (292.5, 22.5), (202.5, 22.5), (337.5, 22.5)],
}


@settings(max_examples=80, deadline=None)
@given(
    dr=st.integers(-7, 7),
    dc=st.integers(-7, 7),
    variant=st.sampled_from(["lh90", "lh180", "lh45"]),
    head=st.integers(0, 11),
    scale=st.sampled_from([1.0, 0.4375, 3.0]),
)
def test_mask_is_the_closed_angular_cone(dr: int, dc: int, variant: str, head: int, scale: float) -> None:
    """Also for scaled (interpolated) positions, whose boundary keys must stay inside."""
    layer = make(heads=12, variant=variant).make_layer(0)
    coords = scale * torch.tensor([[[7.0, 7.0], [7.0 + dr, 7.0 + dc]]])
    layout = PositionLayout(coords=coords, has_pos=torch.ones(1, 2, dtype=torch.bool), grid_shape=(15, 15))
    x = torch.zeros(1, 2, 96)
    bias = layer.bias(None, None, AttentionInputs(x_q=x, x_k=x, query=layout, key=layout))
    if head >= 8 or (dr == 0 and dc == 0):
        inside = True  # unmasked heads, and the query itself
    else:
        centre, half = CONES[variant][head]
        angle = math.degrees(math.atan2(-dr, dc))
        gap = abs((angle - centre + 180.0) % 360.0 - 180.0)
        inside = gap <= half + 1e-9
    assert bool(torch.isfinite(bias[0, head, 0, 1])) == inside


def test_float64_model_keeps_positions_in_float64() -> None:
    torch.manual_seed(0)
    enc = make(heads=4, grid=(4, 4))
    model = TransformerEncoder(DIM, 2, HEADS, enc).eval()
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=1)
    x = torch.randn(2, 17, DIM)
    out32 = model(x, layout)
    model = model.double()
    layout64 = layout.with_coords(layout.coords.double() + 1e9)  # far from 0: float32 would round
    out64 = model(x.double(), layout64)
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), out32, atol=1e-5, rtol=1e-5)
    bias = model.blocks[0].attn.encoding.bias(None, None, AttentionInputs(x_q=x, x_k=x, query=layout64, key=layout64))
    assert bias.dtype == torch.float64
    assert bias[0, 3, 1, 2].item() == pytest.approx(-2 * 1.5 * 0.5)  # down-right sees one step right


def test_options_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="variant 'custom' needs head_groups"):
        make(variant="custom")
    with pytest.raises(ValueError, match="set variant: custom"):
        make(variant="lh45", head_groups=["halves"])
    with pytest.raises(ValueError, match="names a group twice"):
        make(variant="custom", head_groups=["triangles", "triangles"])
    with pytest.raises(ValueError, match="head_groups"):
        make(variant="custom", head_groups=["quarters"])


def test_cls_unbiased_unmasked_and_self_always_visible() -> None:
    enc = make(heads=12, variant="lh45")
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=1)
    bias = layer_bias(enc, 1, layout)
    assert torch.equal(bias[:, :, 0, :], torch.zeros_like(bias[:, :, 0, :]))
    assert torch.equal(bias[:, :, :, 0], torch.zeros_like(bias[:, :, :, 0]))
    assert bias.shape == (1, 12, 17, 17)  # a grid shared by both samples: built once
    assert torch.equal(bias.diagonal(dim1=-2, dim2=-1), torch.zeros(1, 12, 17))


def test_padding_changes_nothing_and_larger_grid_runs() -> None:
    torch.manual_seed(0)
    enc = make(grid=(4, 4))
    model = TransformerEncoder(DIM, 3, HEADS, enc).eval()
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=1)
    x = torch.randn(2, 17, DIM)
    out = model(x, layout)
    padded, x_padded = with_padding(layout, x, 5, torch.Generator().manual_seed(1), at=7.0)
    out_padded = model(x_padded, padded)
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
    directed = {Principle.TRANSLATION_INVARIANCE, Principle.DISTANCE_DECAY, Principle.DIRECTIONALITY}
    assert enc.claimed_principles() == directed
    # Unmasked heads only: 2D-ALiBi, symmetric; no slope: no decay.
    assert make(variant="custom", head_groups=["none"]).claimed_principles() == directed - {Principle.DIRECTIONALITY}
    assert make(global_slope=0.0).claimed_principles() == directed - {Principle.DISTANCE_DECAY}
