"""Learnable relative-position bias: bias_hij = T_h[clip(round(r_j - r_i), -w, w)] (Shaw et al. style)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import Geometry, NotApplicableError, PositionLayout, Principle, build
from pe_bench.harness.conformance.probes import (
    LAYER_HEADS,
    assert_all_parameters_learn,
    assert_cls_position_free,
    assert_padding_inert,
    make_attention,
    plain_copy,
    random_layout,
)

FAST = settings(max_examples=12, deadline=None)


def bias_of(attn, x, layout):
    return attn.logits(x, layout) - plain_copy(attn).logits(x, layout)


def line_layout(positions: list[float]) -> PositionLayout:
    coords = torch.tensor(positions, dtype=torch.float64).view(1, -1, 1)
    return PositionLayout(coords=coords, has_pos=torch.ones(1, len(positions), dtype=torch.bool))


def test_bias_is_table_lookup_at_clipped_offset():
    """Independent reference: loop over pairs, round the offset, clip per axis, index the 2D table."""
    attn = make_attention("relpos", 2, {"window": (2, 3)})
    layout, x = random_layout(1, 12, 2, scale=3.0)
    table = attn.encoding.table.detach().view(LAYER_HEADS, 5, 7)
    bias = bias_of(attn, x, layout)
    r = layout.coords[0]
    for i in range(12):
        for j in range(12):
            dy, dx = (round(float(v)) for v in r[j] - r[i])
            cell = table[:, min(max(dy, -2), 2) + 2, min(max(dx, -3), 3) + 3]
            torch.testing.assert_close(bias[0, :, i, j], cell)


def test_offsets_beyond_the_window_share_the_edge_cell():
    attn = make_attention("relpos", 1, {"window": 3})
    layout = line_layout([0.0, 3.0, 4.0, 9.0, -3.0, -20.0])
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    bias = bias_of(attn, x, layout)[0]  # (H, 6, 6), row = query at 0
    table = attn.encoding.table.detach()  # (H, 7): offsets -3..3
    for j in (1, 2, 3):  # offsets 3, 4, 9 -> cell +3
        torch.testing.assert_close(bias[:, 0, j], table[:, 6])
    for j in (4, 5):  # offsets -3, -20 -> cell -3
        torch.testing.assert_close(bias[:, 0, j], table[:, 0])
    assert not torch.allclose(table[:, 6], table[:, 0])


def test_non_integer_positions_round_to_nearest_offset():
    attn = make_attention("relpos", 1, {"window": 4})
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    exact = bias_of(attn, x, line_layout([0.0, 1.0, 2.0, -3.0]))
    jittered = bias_of(attn, x, line_layout([0.1, 0.8, 2.2, -2.85]))  # every offset within 0.4 of integer
    torch.testing.assert_close(jittered, exact)
    table = attn.encoding.table.detach()
    torch.testing.assert_close(bias_of(attn, x, line_layout([0.0, 1.6, 2.0, -3.0]))[0, :, 0, 1], table[:, 4 + 2])


@FAST
@given(pos_dim=st.integers(1, 3), seed=st.integers(0, 1000))
def test_translation_invariance_for_any_shift(pos_dim, seed):
    attn = make_attention("relpos", pos_dim, {"window": 3})
    # Integer grid positions moved by an arbitrary real shift: offsets stay integers exactly.
    layout, x = random_layout(2, 16, pos_dim, prefix=1, seed=seed)
    layout = layout.with_coords(layout.coords.round())
    shift = 30.0 * torch.randn(2, 1, pos_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    torch.testing.assert_close(attn.logits(x, layout.with_coords(layout.coords + shift)), attn.logits(x, layout))


def test_cross_attention_with_different_layouts():
    attn = make_attention("relpos", 1, {"window": 5}, cross=True)
    query = line_layout([0.0, 2.0])
    key = line_layout([1.0, 2.0, 3.0, 10.0, -1.0])
    x = torch.randn(1, 2, 32, dtype=torch.float64)
    context = torch.randn(1, 5, 32, dtype=torch.float64)
    bias = attn.logits(x, query, context, key) - plain_copy(attn).logits(x, query, context, key)
    table = attn.encoding.table.detach()
    offsets = [[1, 2, 3, 5, -1], [-1, 0, 1, 5, -3]]  # clipped at 5
    for i, row in enumerate(offsets):
        for j, off in enumerate(row):
            torch.testing.assert_close(bias[0, :, i, j], table[:, off + 5])


def test_padding_cls_and_gradients_on_a_grid():
    # Default window on a 4 x 4 grid: 3 per axis, so every one of the 7 x 7 cells is used.
    attn = make_attention("relpos", 2, grid_shape=(4, 4))
    assert attn.encoding.table.shape == (LAYER_HEADS, 49)
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=2)
    x = torch.randn(2, 18, 32, dtype=torch.float64)
    assert_padding_inert(attn, layout, x)
    assert_cls_position_free(attn, layout, x, prefix=2)
    bias = bias_of(attn, x, layout)
    assert (bias[:, :, :2] == 0).all() and (bias[:, :, :, :2] == 0).all()  # CLS rows and columns
    assert_all_parameters_learn(attn, layout, x)


def test_windows_applicability_and_principles():
    assert build("relpos", Geometry(pos_dim=3, grid_shape=(2, 5, 7)), 32, 4, 1).window == (1, 4, 6)
    assert build("relpos", Geometry(pos_dim=2), 32, 4, 1).window == (16, 16)
    with pytest.raises(ValueError, match="window"):
        build("relpos", Geometry(pos_dim=2), 32, 4, 1, {"window": (1, 2, 3)})
    with pytest.raises(NotApplicableError):
        build("relpos", Geometry(pos_dim=4), 32, 4, 1)
    assert build("relpos", Geometry(pos_dim=1), 32, 4, 1).claimed_principles() == {Principle.TRANSLATION_INVARIANCE}
