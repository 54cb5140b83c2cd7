"""Shared parts of STRING (Schenck et al., "Learning the RoPEs: Better 2D and 3D Position
Encodings with STRING", arXiv 2502.02562, Section 3).

STRING encodes a token z at position r as R(r) z, R(r) = exp(Σ_k L_k r_k) with commuting
antisymmetric generators L_k (Definition 3.1). Then R(r_i)^T R(r_j) = R(r_j - r_i), so

    <R(r_i) q, R(r_j) k> = q^T R(r_j - r_i) k

depends on positions only through r_j - r_i: translation invariance, exactly (up to float
rounding). Two efficient instantiations (Section 3.2), one file each:

* string-cayley:    R(r) = RoPE(r) P with P = (I - S)(I + S)^{-1} (Theorem 3.4 and its
                    footnote): the learnable orthogonal P acts *first*, RoPE second, and
                    the same P is used for q and k, so the score is (Pq)^T RoPE(r_j - r_i) (Pk).
                    (P applied after RoPE would cancel in the dot product and do nothing.)
* string-circulant: L_k = C_k - C_k^T with C_k circulant, on blocks of the head (Appendix
                    E's block size). Every such L_k is diagonalised by the same real Fourier
                    basis F (Theorem 3.5's FFT form), exp(Σ_k L_k r_k) = F^T RoPE(r) F, and F^T
                    cancels in the dot product as P's inverse would: the score is
                    (Fq)^T RoPE(r_j - r_i) (Fk), with F fixed and the phases learned.

Both are thus a basis change B (P or F) followed by a rotation of consecutive pairs, and one
code path serves them: z -> rotate(B z), with the rotation tables built once per call for q
and k (rope.py's ``rotate``).

Both q/k transforms keep the head width and build no N x N tensor (fused-kernel friendly).
Tokens without a position get R(0) = I, after the position-free basis change (P or F).
As in rope_mixed, positions are first taken relative to the mean positioned key (exact for
positioned pairs), so the CLS sits at the key centroid, not at the absolute origin, and a
translation of all positions changes no logit, the CLS's included; masking keys moves the
centroid and so changes the CLS's logits. The paper does not say how its ViTs treat the
CLS.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from .base import AttentionInputs, EncodingOptions, LayerEncoding, PositionEncoding, Principle, key_centred_layouts
from .rope import rotate_qk
from .rope_mixed import mixed_angles


class STRINGOptions(EncodingOptions):
    # Frequency ladder base^(-l/levels) of the RoPE that STRING starts from; 100 as rope.py.
    base: float = Field(100.0, gt=0.0)


class STRINGLayer(LayerEncoding):
    """z -> RoPE(r) B z for queries and keys, each with its own layout (they may differ).

    Subclasses give ``generators``: the position-independent parts, computed once per call
    and shared by q and k: the orthogonal basis B, (H, d, d) per head or (d, d) for all, and
    (H, P, F) frequency vectors whose angles <θ_f, r> (rope_mixed's ``mixed_angles``) turn
    the first F pairs of consecutive channels of B z.
    """

    def generators(self) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        basis, frequencies = self.generators()
        query, key = key_centred_layouts(inputs, frequencies.dtype)
        q_angles = mixed_angles(query, frequencies)
        k_angles = q_angles if key is query else mixed_angles(key, frequencies)
        basis = basis.to(q.dtype)
        return rotate_qk(in_basis(q, basis), in_basis(k, basis), q_angles, k_angles)


def in_basis(z: Tensor, basis: Tensor) -> Tensor:
    """B z for (B, H, N, d) z, B in z's dtype: one matrix product with a shared (d, d)
    basis, one per head with an (H, d, d) basis."""
    if basis.ndim == 2:
        return z @ basis.T
    return torch.einsum("hed,bhnd->bhne", basis, z)


class STRINGEncoding(PositionEncoding):
    """Common base: STRING is translation invariant and keeps the fused kernel."""

    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL})
