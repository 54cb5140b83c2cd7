"""Cayley-STRING (string.txt 3.2): z -> RoPE(r) P z, P = (I - S)(I + S)^{-1}, S antisymmetric."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import AttentionInputs, Geometry, PositionLayout, Principle, build
from pe_bench.adapters.rope import rotate_pairs
from pe_bench.adapters.rope_mixed import mixed_angles
from pe_bench.adapters.string_cayley import cayley
from pe_bench.harness.conformance.probes import (
    LAYER_HEADS,
    assert_all_parameters_learn,
    assert_cls_position_free,
    assert_padding_inert,
    make_attention,
    random_layout,
)

FAST = settings(max_examples=10, deadline=None)


def trained_like(pos_dim: int, seed: int = 0, cross: bool = False):
    """A Cayley-STRING layer with a random S and perturbed frequencies (not the RoPE start)."""
    attn = make_attention("string-cayley", pos_dim, seed=seed, cross=cross)
    with torch.no_grad():
        attn.encoding.s_upper.normal_(0.0, 0.5)
        attn.encoding.frequencies.add_(0.3 * torch.randn_like(attn.encoding.frequencies))
    return attn


@FAST
@given(dim=st.integers(2, 12), seed=st.integers(0, 1000))
def test_cayley_is_special_orthogonal(dim, seed):
    gen = torch.Generator().manual_seed(seed)
    p = cayley(3.0 * torch.randn(2, dim * (dim - 1) // 2, generator=gen, dtype=torch.float64), dim)
    torch.testing.assert_close(p.transpose(-1, -2) @ p, torch.eye(dim, dtype=torch.float64).expand(2, -1, -1))
    torch.testing.assert_close(torch.linalg.det(p), torch.ones(2, dtype=torch.float64))


def test_layer_p_is_orthogonal_and_matches_the_cayley_formula():
    attn = trained_like(2)
    p = attn.encoding.qk_basis()
    d = attn.head_dim
    rows, cols = torch.triu_indices(d, d, offset=1)
    s = torch.zeros(LAYER_HEADS, d, d, dtype=torch.float64)
    s[:, rows, cols] = attn.encoding.s_upper.detach()
    s = s - s.transpose(-1, -2)
    eye = torch.eye(d, dtype=torch.float64)
    torch.testing.assert_close(p, (eye - s) @ torch.linalg.inv(eye + s))
    torch.testing.assert_close(p.transpose(-1, -2) @ p, eye.expand(LAYER_HEADS, -1, -1))


@FAST
@given(pos_dim=st.integers(1, 3), seed=st.integers(0, 1000))
def test_exact_translation_invariance(pos_dim, seed):
    attn = trained_like(pos_dim, seed)
    layout, x = random_layout(2, 16, pos_dim, prefix=1, seed=seed)
    shift = 40.0 * torch.randn(2, 1, pos_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    torch.testing.assert_close(attn.logits(x, layout.with_coords(layout.coords + shift)), attn.logits(x, layout))


def test_translation_invariance_in_cross_attention():
    attn = trained_like(3, cross=True)
    query, x = random_layout(2, 5, 3, prefix=1, seed=3)
    key, context = random_layout(2, 17, 3, prefix=1, seed=4)
    shift = torch.tensor([7.0, -2.5, 19.0], dtype=torch.float64)
    moved = attn.logits(x, query.with_coords(query.coords + shift), context, key.with_coords(key.coords + shift))
    torch.testing.assert_close(moved, attn.logits(x, query, context, key))


def test_score_is_pq_rope_of_offset_pk():
    """<R(r_i) q, R(r_j) k> = (P q)^T RoPE(r_j - r_i) (P k): P acts before RoPE, shared by q and k."""
    attn = trained_like(2)
    layout, x = random_layout(1, 6, 2)
    q = torch.randn(1, LAYER_HEADS, 6, attn.head_dim, dtype=torch.float64)
    k = torch.randn(1, LAYER_HEADS, 6, attn.head_dim, dtype=torch.float64)
    q_enc, k_enc = attn.encoding.transform_qk(q, k, AttentionInputs(x_q=x, x_k=x, query=layout, key=layout))
    scores = q_enc @ k_enc.transpose(-1, -2)
    p, freqs = attn.encoding.qk_basis(), attn.encoding.rotation_frequencies()
    pq, pk = torch.einsum("hed,bhnd->bhne", p, q), torch.einsum("hed,bhnd->bhne", p, k)
    i, j = 1, 4
    offset = PositionLayout(
        coords=layout.coords[:, j : j + 1] - layout.coords[:, i : i + 1], has_pos=torch.ones(1, 1) > 0
    )
    angles = mixed_angles(offset, freqs)
    pk_rel = rotate_pairs(pk[:, :, j : j + 1], angles.cos(), angles.sin())
    expected = (pq[:, :, i : i + 1] * pk_rel).sum(-1)[..., 0]
    torch.testing.assert_close(scores[:, :, i, j], expected)
    # P is not a no-op (it would cancel if it were applied after the rotation).
    plain_rope = rotate_pairs(q, *_cos_sin(layout, freqs)) @ rotate_pairs(k, *_cos_sin(layout, freqs)).mT
    assert not torch.allclose(scores, plain_rope, atol=1e-3)


def _cos_sin(layout, freqs):
    angles = mixed_angles(layout, freqs)
    return angles.cos(), angles.sin()


def test_starts_as_axial_rope():
    """S = 0 and rope.py's axial frequencies at initialisation: the logits equal axial RoPE's,
    the position-free CLS's row and column included (both leave it unrotated), up to the
    float32 rounding of the two frequency ladders (exp/log against base ** x)."""
    string = make_attention("string-cayley", 2)
    rope = make_attention("rope", 2)
    rope.load_state_dict({k: v for k, v in string.state_dict().items() if not k.startswith("encoding.")})
    layout, x = random_layout(2, 16, 2, prefix=1)
    torch.testing.assert_close(string.logits(x, layout), rope.logits(x, layout))


def test_padding_cls_and_gradients():
    attn = trained_like(2)
    layout, x = random_layout(2, 16, 2, prefix=2)
    assert_padding_inert(attn, layout, x)
    assert_cls_position_free(attn, layout, x, prefix=2)
    assert_all_parameters_learn(attn, layout, x)
    # From the S = 0 start S learns too, except the entries S[2f, 2f+1] inside a RoPE plane:
    # at S = 0 they rotate q and k alike within a plane whose rotation commutes with RoPE's,
    # which cancels in q.k (a symmetry of the starting point, broken once S moves).
    fresh = make_attention("string-cayley", 2)
    fresh(x, layout).square().sum().backward()
    d = fresh.head_dim
    rows, cols = torch.triu_indices(d, d, offset=1)
    in_plane = (rows % 2 == 0) & (cols == rows + 1)
    grad = fresh.encoding.s_upper.grad
    assert (grad[:, ~in_plane] != 0).all()
    torch.testing.assert_close(grad[:, in_plane], torch.zeros_like(grad[:, in_plane]))


def test_frozen_frequencies_and_principles():
    enc = build("string-cayley", Geometry(pos_dim=2), 32, 4, 1, {"learn_frequencies": False})
    layer = enc.make_layer(0)
    assert not layer.frequencies.requires_grad and layer.s_upper.requires_grad
    assert enc.claimed_principles() == {Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL}
    assert layer.s_upper.shape == (4, 8 * 7 // 2)  # d(d-1)/2 free entries per head
