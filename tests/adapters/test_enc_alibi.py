"""nD-ALiBi (Fuller et al. 2023; Press et al. slopes): bias = -slope_h ||r_j - r_i||_2."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import Geometry, Principle, build
from pe_bench.adapters.alibi import alibi_slopes
from pe_bench.harness.conformance.probes import (
    LAYER_HEADS,
    assert_cls_position_free,
    assert_padding_inert,
    make_attention,
    plain_copy,
    random_layout,
    random_rotation,
)

FAST = settings(max_examples=12, deadline=None)


def test_slopes_are_press_et_al():
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8]))
    torch.testing.assert_close(alibi_slopes(8), 2.0 ** -torch.arange(1.0, 9.0))
    # Not a power of two: 8 slopes of the 8-head ladder, then h = 1, 3, 5, 7 of the 16-head one.
    twelve = torch.cat([2.0 ** -torch.arange(1.0, 9.0), 2.0 ** -torch.tensor([0.5, 1.5, 2.5, 3.5])])
    torch.testing.assert_close(alibi_slopes(12), twelve)


@FAST
@given(pos_dim=st.integers(1, 3), seed=st.integers(0, 1000))
def test_bias_is_minus_slope_times_euclidean_distance(pos_dim, seed):
    attn = make_attention("alibi", pos_dim)
    layout, x = random_layout(2, 16, pos_dim, seed=seed)
    bias = attn.logits(x, layout) - plain_copy(attn).logits(x, layout)
    dist = (layout.coords[:, None, :, :] - layout.coords[:, :, None, :]).norm(dim=-1)  # (B, Nq, Nk)
    slopes = torch.tensor([2.0 ** (-8 * h / LAYER_HEADS) for h in range(1, LAYER_HEADS + 1)], dtype=torch.float64)
    torch.testing.assert_close(bias, -slopes[None, :, None, None] * dist[:, None])


@FAST
@given(pos_dim=st.integers(2, 3), seed=st.integers(0, 1000))
def test_rotation_and_translation_invariance(pos_dim, seed):
    attn = make_attention("alibi", pos_dim)
    layout, x = random_layout(2, 16, pos_dim, prefix=1, seed=seed)
    shift = 30.0 * torch.randn(pos_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    moved = layout.with_coords(layout.coords @ random_rotation(pos_dim, torch.Generator().manual_seed(seed)).T + shift)
    torch.testing.assert_close(attn.logits(x, moved), attn.logits(x, layout))


def test_cross_attention_uses_both_layouts():
    attn = make_attention("alibi", 2, cross=True)
    query, x = random_layout(1, 6, 2, seed=3)
    key, context = random_layout(1, 11, 2, seed=4)
    bias = attn.logits(x, query, context, key) - plain_copy(attn).logits(x, query, context, key)
    dist = torch.cdist(query.coords, key.coords)
    torch.testing.assert_close(bias, -alibi_slopes(LAYER_HEADS).double()[None, :, None, None] * dist[:, None])


def test_padding_and_cls():
    attn = make_attention("alibi", 2)
    layout, x = random_layout(2, 16, 2, prefix=2)
    assert_padding_inert(attn, layout, x)
    assert_cls_position_free(attn, layout, x, prefix=2)
    logits, plain = attn.logits(x, layout), plain_copy(attn).logits(x, layout)
    torch.testing.assert_close(logits[:, :, :2], plain[:, :, :2])  # CLS rows: no bias
    torch.testing.assert_close(logits[:, :, :, :2], plain[:, :, :, :2])  # CLS columns: no bias


def test_no_parameters_gradients_reach_attention():
    attn = make_attention("alibi", 2)
    assert not list(attn.encoding.parameters())  # slopes are fixed
    layout, x = random_layout(2, 16, 2, prefix=1)
    attn(x, layout).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in attn.parameters())


def test_principles():
    enc = build("alibi", Geometry(pos_dim=3), 32, 4, 1)
    assert enc.claimed_principles() == {
        Principle.TRANSLATION_INVARIANCE,
        Principle.ROTATION_INVARIANCE,
        Principle.DISTANCE_DECAY,
    }
