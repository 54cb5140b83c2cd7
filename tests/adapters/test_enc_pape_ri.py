"""PaPE-RI (pape.txt Section 4, Appendix A.1): S_ij = <q_i, k_j> + α_i w_p^2 ||r_j - r_i||^2."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import AttentionInputs, Geometry, Principle, build, get
from pe_bench.harness.conformance.probes import (
    LAYER_HEADS,
    assert_all_parameters_learn,
    assert_cls_position_free,
    assert_padding_inert,
    efficient_and_explicit,
    make_attention,
    plain_copy,
    random_layout,
    random_rotation,
    with_padding,
)

FAST = settings(max_examples=12, deadline=None)


def pair(pos_dim: int, cross: bool = False):
    """The efficient and the explicit form with identical weights."""
    return efficient_and_explicit("pape-ri", pos_dim, cross=cross)


@settings(max_examples=8, deadline=None)
@given(pos_dim=st.integers(1, 3), prefix=st.integers(0, 2), scale=st.sampled_from([0.5, 4.0, 30.0]))
def test_efficient_equals_explicit(pos_dim, prefix, scale):
    efficient, explicit = pair(pos_dim)
    layout, x = random_layout(2, 16, pos_dim, prefix=prefix, scale=scale)
    torch.testing.assert_close(efficient.logits(x, layout), explicit.logits(x, layout))
    torch.testing.assert_close(efficient(x, layout), explicit(x, layout))


def test_efficient_equals_explicit_cross_attention():
    efficient, explicit = pair(2, cross=True)
    query, x = random_layout(2, 9, 2, prefix=1, seed=3)
    key, context = random_layout(2, 20, 2, prefix=1, seed=4)
    key, context = with_padding(key, context, 3, torch.Generator().manual_seed(2))
    for attn in (efficient, explicit):
        assert attn.logits(x, query, context, key).shape == (2, LAYER_HEADS, 10, 24)
    torch.testing.assert_close(efficient.logits(x, query, context, key), explicit.logits(x, query, context, key))


def test_bias_is_alpha_times_scaled_squared_distance():
    """The positional term is α_i w_p^2 ||r_j - r_i||^2 / sqrt(h) with α_i = -softplus(w_α x_i)."""
    attn, _ = pair(3)
    layout, x = random_layout(2, 16, 3)
    bias = attn.logits(x, layout) - plain_copy(attn).logits(x, layout)
    layer = attn.encoding
    alpha = -F.softplus(layer.w_alpha(x)).transpose(1, 2)  # (B, H, N)
    dist2 = torch.cdist(layout.coords, layout.coords).square()
    expected = alpha[..., None] * layer.w_p[None, :, None, None] ** 2 * dist2[:, None] / math.sqrt(attn.head_dim)
    torch.testing.assert_close(bias, expected)
    assert (bias <= 1e-12).all()  # distance decay: α < 0


@FAST
@given(pos_dim=st.integers(2, 3), seed=st.integers(0, 1000), form=st.sampled_from(["efficient", "explicit"]))
def test_rotation_and_translation_invariance(pos_dim, seed, form):
    attn = make_attention("pape-ri", pos_dim, {"form": form})
    layout, x = random_layout(2, 16, pos_dim, prefix=1)
    rotation = random_rotation(pos_dim, torch.Generator().manual_seed(seed))
    shift = torch.randn(pos_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 20
    moved = layout.with_coords(layout.coords @ rotation.T + shift)
    torch.testing.assert_close(attn.logits(x, moved), attn.logits(x, layout))


def test_not_directional():
    """b = 0: mirroring all positions (r -> -r, a rotation only for even P) changes nothing."""
    attn = make_attention("pape-ri", 3)
    layout, x = random_layout(2, 16, 3)
    torch.testing.assert_close(attn.logits(x, layout.with_coords(-layout.coords)), attn.logits(x, layout))


def test_widening_is_head_plus_p_plus_two_padded():
    attn = make_attention("pape-ri", 3, {"pad_to": 1})
    layout, x = random_layout(1, 5, 3)
    q = k = torch.randn(1, LAYER_HEADS, 5, attn.head_dim, dtype=torch.float64)
    inputs = AttentionInputs(x_q=x, x_k=x, query=layout, key=layout)
    q_ext, k_ext = attn.encoding.transform_qk(q, k, inputs)
    assert q_ext.shape[-1] == k_ext.shape[-1] == attn.head_dim + 3 + 2
    padded = make_attention("pape-ri", 3)  # pad_to 8
    assert padded.encoding.transform_qk(q, k, inputs)[0].shape[-1] == 16


@pytest.mark.parametrize("form", ["efficient", "explicit"])
def test_padding_cls_and_gradients(form):
    attn = make_attention("pape-ri", 2, {"form": form})
    layout, x = random_layout(2, 16, 2, prefix=2)
    assert_padding_inert(attn, layout, x)
    assert_cls_position_free(attn, layout, x, prefix=2)
    # CLS rows and columns carry no bias at all.
    plain = plain_copy(attn).logits(x, layout)
    logits = attn.logits(x, layout)
    torch.testing.assert_close(logits[:, :, :2], plain[:, :, :2])
    torch.testing.assert_close(logits[:, :, :, :2], plain[:, :, :, :2])
    assert_all_parameters_learn(attn, layout, x)


def test_principles():
    cls = get("pape-ri")
    assert cls.principles == {
        Principle.TRANSLATION_INVARIANCE,
        Principle.ROTATION_INVARIANCE,
        Principle.DISTANCE_DECAY,
        Principle.CONTEXT_AWARENESS,
        Principle.FUSED_KERNEL,
    }
    enc = build("pape-ri", Geometry(pos_dim=2), 32, 4, 1, {"form": "explicit"})
    assert Principle.FUSED_KERNEL not in enc.claimed_principles()


def test_official_wp_init_is_a_frozen_uniform_draw():
    """Official code: w_p ~ U(-1/sqrt(P), 1/sqrt(P)) per layer and head, a buffer."""
    torch.manual_seed(0)
    enc = build("pape-ri", Geometry(pos_dim=2), 2000, 2000, 2)  # 2000 heads: many draws
    first, second = enc.make_layer(0), enc.make_layer(1)
    assert enc.options.wp_init == "official"
    assert "w_p" not in dict(first.named_parameters())  # not trained ...
    assert "w_p" in first.state_dict()  # ... but checkpointed
    bound = 1 / math.sqrt(2)
    assert first.w_p.abs().max() <= bound
    assert first.w_p.min() < -0.95 * bound and first.w_p.max() > 0.95 * bound
    assert abs(first.w_p.mean().item()) < 0.05  # centred (std of the mean ~0.009)
    assert not torch.equal(first.w_p, second.w_p)  # a fresh draw per layer
    torch.manual_seed(0)
    again = build("pape-ri", Geometry(pos_dim=2), 2000, 2000, 2).make_layer(0)
    torch.testing.assert_close(again.w_p, first.w_p)  # drawn from the seeded global generator
    three_d = build("pape-ri", Geometry(pos_dim=3), 2000, 2000, 1).make_layer(0)
    assert three_d.w_p.abs().max() <= 1 / math.sqrt(3)


def test_geometric_wp_init_is_learnable_alibi_like():
    layer = build("pape-ri", Geometry(pos_dim=2), 32, 4, 1, {"wp_init": "geometric"}).make_layer(0)
    assert "w_p" in dict(layer.named_parameters())
    torch.testing.assert_close(layer.w_p.detach(), torch.tensor([2**-1, 2**-2, 2**-3, 2**-4]))
    attn = make_attention("pape-ri", 2, {"wp_init": "geometric"})
    layout, x = random_layout(2, 16, 2, prefix=1)
    assert_all_parameters_learn(attn, layout, x)


@pytest.mark.parametrize("wp_init", ["official", "geometric"])
def test_both_initialisations_agree_across_forms_and_decay(wp_init):
    efficient = make_attention("pape-ri", 2, {"wp_init": wp_init})
    explicit = make_attention("pape-ri", 2, {"form": "explicit", "wp_init": wp_init})
    explicit.load_state_dict(efficient.state_dict())
    layout, x = random_layout(2, 16, 2, prefix=1)
    torch.testing.assert_close(efficient.logits(x, layout), explicit.logits(x, layout))
    bias = efficient.logits(x, layout) - plain_copy(efficient).logits(x, layout)
    assert (bias <= 1e-12).all()
