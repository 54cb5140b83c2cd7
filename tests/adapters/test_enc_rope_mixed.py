"""RoPE-Mixed (Heo et al. 2024): pair f rotates by <θ_f, r>, θ_f in R^P learnable per layer/head."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import AttentionInputs, Geometry, Principle, build
from pe_bench.adapters.base import PositionLayout
from pe_bench.harness.attention import Attention
from pe_bench.harness.conformance.probes import (
    LAYER_HEADS,
    assert_all_parameters_learn,
    assert_cls_position_free,
    assert_padding_inert,
    make_attention,
    random_layout,
)

FAST = settings(max_examples=12, deadline=None)


@FAST
@given(pos_dim=st.integers(1, 3), seed=st.integers(0, 1000), scale=st.sampled_from([1.0, 10.0]))
def test_logits_depend_on_relative_positions_only(pos_dim, seed, scale):
    attn = make_attention("rope-mixed", pos_dim, seed=seed)
    layout, x = random_layout(2, 16, pos_dim, prefix=1, scale=scale, seed=seed)
    shift = 25.0 * torch.randn(2, 1, pos_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    # All logits, the CLS's included: the CLS sits at the key centroid, which moves along.
    torch.testing.assert_close(attn.logits(x, layout.with_coords(layout.coords + shift)), attn.logits(x, layout))


def test_relative_only_in_cross_attention():
    attn = make_attention("rope-mixed", 2, cross=True)
    query, x = random_layout(2, 7, 2, prefix=1, seed=3)
    key, context = random_layout(2, 19, 2, seed=4)
    shift = torch.tensor([3.5, -11.0], dtype=torch.float64)
    moved = attn.logits(x, query.with_coords(query.coords + shift), context, key.with_coords(key.coords + shift))
    torch.testing.assert_close(moved, attn.logits(x, query, context, key))


def test_rotation_uses_mixed_angles():
    """Each pair is rotated by the angle <θ_f, r - mean(r)> summed over all axes (not per axis)."""
    attn = make_attention("rope-mixed", 3)
    freqs = attn.encoding.frequencies.detach()  # (H, P, F)
    layout, _ = random_layout(1, 4, 3)
    centred = layout.coords - layout.coords.mean(1, keepdim=True)  # the frame of the keys' centroid
    z = torch.randn(1, LAYER_HEADS, 4, attn.head_dim, dtype=torch.float64)
    inputs = AttentionInputs(x_q=z[:, 0], x_k=z[:, 0], query=layout, key=layout)
    rotated, _ = attn.encoding.transform_qk(z, z, inputs)
    pairs = freqs.shape[-1]
    for h in range(LAYER_HEADS):
        for n in range(4):
            for f in range(pairs):
                angle = float(centred[0, n] @ freqs[h, :, f])
                c, s = math.cos(angle), math.sin(angle)
                a, b = z[0, h, n, 2 * f], z[0, h, n, 2 * f + 1]
                expected = torch.stack([c * a - s * b, s * a + c * b])
                torch.testing.assert_close(rotated[0, h, n, 2 * f : 2 * f + 2], expected)
    torch.testing.assert_close(rotated[..., 2 * pairs :], z[..., 2 * pairs :])  # unrotated rest


def test_directional_not_rotation_invariant():
    attn = make_attention("rope-mixed", 2)
    layout, x = random_layout(2, 16, 2)
    logits = attn.logits(x, layout)
    # Mirroring r -> -r flips every offset; a direction-aware head notices.
    assert not torch.allclose(attn.logits(x, layout.with_coords(-layout.coords)), logits, atol=1e-3)


@pytest.mark.parametrize("pos_dim", [1, 2, 3])
def test_initialisation(pos_dim):
    """Magnitudes base^(-l/levels) per level; per head an orthonormal frame of P directions."""
    head_dim = 24
    enc = build("rope-mixed", Geometry(pos_dim=pos_dim), head_dim * LAYER_HEADS, LAYER_HEADS, depth=2)
    layer0, layer1 = enc.make_layer(0), enc.make_layer(1)
    freqs = layer0.frequencies.detach()  # (H, P, levels * P), direction-major
    levels = head_dim // (2 * pos_dim)
    assert freqs.shape == (LAYER_HEADS, pos_dim, levels * pos_dim)
    per_dir = freqs.unflatten(-1, (pos_dim, levels))  # (H, coord, direction, level)
    ladder = 10.0 ** (-torch.arange(levels) / levels)
    torch.testing.assert_close(per_dir.norm(dim=1), ladder.expand(LAYER_HEADS, pos_dim, -1))
    frames = per_dir[..., 0]  # level 0 has magnitude 1: the directions themselves
    eye = torch.eye(pos_dim).expand(LAYER_HEADS, -1, -1)
    torch.testing.assert_close(frames.transpose(-1, -2) @ frames, eye)
    torch.testing.assert_close(torch.linalg.det(frames), torch.ones(LAYER_HEADS))
    if pos_dim == 2:  # rope-vit: directions a and a + π/2
        torch.testing.assert_close(frames[:, :, 1], torch.stack([-frames[:, 1, 0], frames[:, 0, 0]], dim=-1))
    if pos_dim > 1:  # random per head and per layer
        assert not torch.allclose(frames[0], frames[1])
        assert not torch.allclose(layer1.frequencies, layer0.frequencies)
    assert layer0.frequencies.requires_grad


def test_padding_cls_and_gradients():
    attn = make_attention("rope-mixed", 2)
    layout, x = random_layout(2, 16, 2, prefix=2)
    assert_padding_inert(attn, layout, x)
    assert_cls_position_free(attn, layout, x, prefix=2)
    assert_all_parameters_learn(attn, layout, x)


def test_principles_and_head_dim_check():
    enc = build("rope-mixed", Geometry(pos_dim=2), 32, 4, 1)
    assert enc.claimed_principles() == {
        Principle.TRANSLATION_INVARIANCE,
        Principle.DIRECTIONALITY,
        Principle.FUSED_KERNEL,
    }
    with pytest.raises(ValueError, match="head_dim"):
        build("rope-mixed", Geometry(pos_dim=3), 16, 4, 1)


def test_frozen_frequencies_keep_the_initial_rotation():
    """``learn_frequencies=False``: the same initial frequencies (same seed), no gradient
    reaches them, and the logits are those of the learnable layer before any step."""
    learnable = make_attention("rope-mixed", 2, seed=5)
    frozen = make_attention("rope-mixed", 2, {"learn_frequencies": False}, seed=5)
    assert learnable.encoding.frequencies.requires_grad and not frozen.encoding.frequencies.requires_grad
    torch.testing.assert_close(frozen.encoding.frequencies, learnable.encoding.frequencies, rtol=0, atol=0)
    layout, x = random_layout(2, 16, 2, prefix=1, seed=6)
    torch.testing.assert_close(frozen.logits(x, layout), learnable.logits(x, layout), rtol=0, atol=0)
    frozen(x, layout).square().sum().backward()
    assert frozen.encoding.frequencies.grad is None
    assert frozen.qkv.weight.grad is not None and frozen.qkv.weight.grad.abs().sum() > 0


def test_axis_frames_change_the_frames_only():
    """``random_frame=False``: every pair's frequency lies on one coordinate axis, with the
    magnitudes of the random-frame layer, and the weights initialised after the frames (here
    the qkv projection) are those of the random-frame run at the same seed."""
    random_frame = make_attention("rope-mixed", 3, seed=7)
    axis_frame = make_attention("rope-mixed", 3, {"random_frame": False}, seed=7)
    torch.testing.assert_close(axis_frame.qkv.weight, random_frame.qkv.weight, rtol=0, atol=0)
    frequencies = axis_frame.encoding.frequencies.detach()  # (H, P, F)
    assert ((frequencies != 0).sum(dim=1) == 1).all()
    assert not torch.equal(frequencies, random_frame.encoding.frequencies.detach())
    torch.testing.assert_close(
        frequencies.norm(dim=1), random_frame.encoding.frequencies.detach().norm(dim=1), rtol=1e-6, atol=0
    )
    assert axis_frame.encoding.frequencies.requires_grad


def test_frozen_axis_frames_at_base_100_are_axial_rope():
    """With the axes' frames, frozen frequencies and rope's base, RoPE-Mixed's rotation is
    axial RoPE's (rope.py's frequencies in the same direction-major layout): the same logits
    for the same projection weights, the CLS included. Heads of 48 channels give 8 levels per
    axis (the probes' 8-channel heads have one, where the base would not matter)."""
    dim, heads, geometry = 96, 2, Geometry(pos_dim=3)

    def attention(name: str, options: dict | None) -> Attention:
        torch.manual_seed(8)
        return Attention(dim, heads, build(name, geometry, dim, heads, 1, options=options).make_layer(0)).double()

    options = {"random_frame": False, "learn_frequencies": False, "base": 100.0}
    mixed, axial, other_base = (
        attention("rope-mixed", options),
        attention("rope", None),
        attention("rope", {"base": 10.0}),
    )
    projections = {k: v for k, v in mixed.state_dict().items() if not k.startswith("encoding.")}
    axial.load_state_dict(projections)
    other_base.load_state_dict(projections)
    gen = torch.Generator().manual_seed(10)
    coords = 10.0 * torch.randn(2, 17, 3, generator=gen, dtype=torch.float64)
    has_pos = torch.ones(2, 17, dtype=torch.bool)
    has_pos[:, 0] = False
    layout = PositionLayout(coords=coords, has_pos=has_pos)
    x = torch.randn(2, 17, dim, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(mixed.logits(x, layout), axial.logits(x, layout), rtol=1e-6, atol=1e-6)
    # the base matters at this width: a check that the equality above could fail
    assert (mixed.logits(x, layout) - other_base.logits(x, layout)).abs().max() > 1e-2
