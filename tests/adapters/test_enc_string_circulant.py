"""Circulant-STRING (string.txt 3.2, Theorem 3.5): z -> exp(Σ_k r_k (C_k - C_k^T)) z, computed as
RoPE in the fixed real Fourier basis of the blocks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import AttentionInputs, Geometry, PositionLayout, Principle, build
from pe_bench.adapters._string import in_basis
from pe_bench.adapters.rope import rotate_pairs
from pe_bench.adapters.rope_mixed import mixed_angles
from pe_bench.adapters.string_circulant import phases
from pe_bench.harness.conformance.probes import (
    LAYER_HEADS,
    assert_all_parameters_learn,
    assert_cls_position_free,
    assert_padding_inert,
    make_attention,
    random_layout,
)

FAST = settings(max_examples=10, deadline=None)


def trained_like(pos_dim: int, block: int = 4, seed: int = 0, cross: bool = False):
    attn = make_attention("string-circulant", pos_dim, {"block_size": block}, seed=seed, cross=cross)
    with torch.no_grad():
        attn.encoding.u_free.normal_(0.0, 0.7)
    return attn


def explicit_generators(layer, head_dim: int) -> torch.Tensor:
    """L_k = C_k - C_k^T as dense block-diagonal (H, P, d, d) matrices, built from the entries."""
    free = layer.u_free.detach()  # (H, P, blocks, n_free)
    b, n_free = layer.block, free.shape[-1]
    h, p, blocks = free.shape[:3]
    u = torch.zeros(h, p, blocks, b, dtype=free.dtype)
    u[..., 1 : n_free + 1] = free
    u[..., b - n_free :] = -free.flip(-1)
    gens = torch.zeros(h, p, head_dim, head_dim, dtype=free.dtype)
    idx = torch.arange(b)
    circ = u[..., (idx[:, None] - idx[None, :]) % b]  # circulant with first column u
    for blk in range(blocks):
        gens[..., blk * b : (blk + 1) * b, blk * b : (blk + 1) * b] = circ[:, :, blk]
    return gens


@pytest.mark.parametrize(("pos_dim", "block"), [(1, 8), (2, 4), (3, 8), (2, 5)])
def test_fourier_form_is_the_matrix_exponential(pos_dim, block):
    """q and k are encoded as T(r) z = RoPE(θ(r)) F z with the fixed real Fourier basis F; F^T T(r)
    is exp(Σ_k r_k L_k) with the antisymmetric, commuting circulant L_k the entries define, so
    scores are those of the matrix exponentials (F^T cancels in a dot product: F is orthogonal)."""
    head_dim = 40 if block == 5 else 8
    enc = build(
        "string-circulant", Geometry(pos_dim=pos_dim), head_dim * LAYER_HEADS, LAYER_HEADS, 1, {"block_size": block}
    )
    layer = enc.make_layer(0).double()
    with torch.no_grad():
        layer.u_free.normal_(0.0, 0.7)
    gens = explicit_generators(layer, head_dim)
    torch.testing.assert_close(gens.transpose(-1, -2), -gens)
    if pos_dim > 1:
        torch.testing.assert_close(gens[:, 0] @ gens[:, 1], gens[:, 1] @ gens[:, 0])
    basis, phi = layer.qk_basis(), layer.rotation_frequencies()
    eye = torch.eye(head_dim, dtype=torch.float64)
    torch.testing.assert_close(basis @ basis.T, eye)
    # Encode the unit vectors e_1..e_d, all at position r: the outputs are T(r)'s columns.
    # (transform_qk would first centre the positions: all at r -> all at 0.)
    r = torch.tensor([1.7, -0.4, 2.9][:pos_dim], dtype=torch.float64)
    layout = PositionLayout(coords=r.expand(1, head_dim, -1), has_pos=torch.ones(1, head_dim, dtype=torch.bool))
    angles = mixed_angles(layout, phi)
    encoded = rotate_pairs(in_basis(eye.expand(1, LAYER_HEADS, -1, -1), basis), angles.cos(), angles.sin())
    t = encoded[0].transpose(-1, -2)  # (H, d, d)
    torch.testing.assert_close(basis.T @ t, torch.linalg.matrix_exp(torch.einsum("k,hkij->hij", r, gens)))
    torch.testing.assert_close(t.transpose(-1, -2) @ t, eye.expand(LAYER_HEADS, -1, -1))


@FAST
@given(pos_dim=st.integers(1, 3), seed=st.integers(0, 1000), block=st.sampled_from([4, 8]))
def test_exact_translation_invariance(pos_dim, seed, block):
    attn = trained_like(pos_dim, block, seed)
    layout, x = random_layout(2, 16, pos_dim, prefix=1, seed=seed)
    shift = 40.0 * torch.randn(2, 1, pos_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    torch.testing.assert_close(attn.logits(x, layout.with_coords(layout.coords + shift)), attn.logits(x, layout))


def test_translation_invariance_in_cross_attention():
    attn = trained_like(2, cross=True)
    query, x = random_layout(2, 5, 2, prefix=1, seed=3)
    key, context = random_layout(2, 13, 2, prefix=1, seed=4)
    shift = torch.tensor([-9.0, 4.25], dtype=torch.float64)
    moved = attn.logits(x, query.with_coords(query.coords + shift), context, key.with_coords(key.coords + shift))
    torch.testing.assert_close(moved, attn.logits(x, query, context, key))


def test_initial_phases_are_axial_rope_ladder():
    """At initialisation the rotating Fourier planes carry base^(-l/levels), one axis per plane group."""
    enc = build("string-circulant", Geometry(pos_dim=2), 64, 4, 1, {"block_size": 8})
    layer = enc.make_layer(0)
    phi = phases(layer.u_free.detach(), 8)  # (H, P, blocks, 5): DC, 3 rotating planes, Nyquist
    torch.testing.assert_close(phi[..., [0, 4]], torch.zeros_like(phi[..., [0, 4]]))
    rotating = phi[..., 1:4].flatten(-2)  # (H, P, 6 planes)
    ladder = 100.0 ** (-torch.arange(3) / 3)
    expected = torch.zeros(2, 6)
    expected[0, :3], expected[1, 3:] = ladder, ladder
    torch.testing.assert_close(rotating, expected.expand(4, -1, -1), atol=1e-6, rtol=1e-5)


def test_padding_cls_and_gradients():
    attn = trained_like(2)
    layout, x = random_layout(2, 16, 2, prefix=2)
    assert_padding_inert(attn, layout, x)
    assert_cls_position_free(attn, layout, x, prefix=2)
    # Position-free tokens get R(0) = I: the fixed basis change alone, which no score sees.
    z = torch.randn(2, LAYER_HEADS, x.shape[1], attn.head_dim, dtype=torch.float64)
    q, _ = attn.encoding.transform_qk(z, z, AttentionInputs(x_q=x, x_k=x, query=layout, key=layout))
    torch.testing.assert_close(q[:, :, :2], z[:, :, :2] @ attn.encoding.basis.T.to(z.dtype))
    assert_all_parameters_learn(attn, layout, x)
    assert_all_parameters_learn(make_attention("string-circulant", 2, {"block_size": 4}), layout, x)


def test_block_size_validation_and_principles():
    with pytest.raises(ValueError, match="block_size"):
        build("string-circulant", Geometry(pos_dim=2), 32, 4, 1, {"block_size": 3})  # 3 does not divide 8
    enc = build("string-circulant", Geometry(pos_dim=2), 32, 4, 1)  # 16 capped at head_dim 8
    assert enc.block == 8
    assert enc.claimed_principles() == {Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL}


def test_bf16_scores_err_like_the_content_scores():
    """Under bf16 autocast the Fourier basis is a bf16 matrix product: its scores' error
    against float64 stays at the level the content scores' own rounding sets (nopos)."""

    def mean_error(method: str) -> float:
        attn = make_attention(method, 2, {}, seed=0)
        layout, x = random_layout(2, 64, 2, prefix=1, seed=1)
        with torch.no_grad():
            exact = attn.logits(x, layout)
            attn.float()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                rounded = attn.logits(x.float(), layout.with_coords(layout.coords.float())).double()
        return (rounded - exact).abs().mean().item()

    assert mean_error("string-circulant") < 1.5 * mean_error("nopos")
