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
* string-circulant: L_k = C_k - C_k^T with C_k circulant; exp(Σ_k L_k r_k) is applied with
                    the FFT (Theorem 3.5), on blocks of the head (Appendix E's block size).

Both q/k transforms keep the head width and build no N x N tensor (fused-kernel friendly).
Tokens without a position get R(0) = I (Cayley: still the position-free basis change P).
As in rope_mixed, positions are first taken relative to the mean positioned key (exact for
positioned pairs), so the CLS sits at the key centroid, not at the absolute origin, and a
translation of all positions changes no logit, the CLS's included; masking keys moves the
centroid and so changes the CLS's logits. The paper does not say how its ViTs treat the
CLS.
"""

from __future__ import annotations

from torch import Tensor

from .base import AttentionInputs, EncodingOptions, LayerEncoding, PositionEncoding, Principle, key_centred_layouts
from .rope_mixed import mixed_angles


class STRINGOptions(EncodingOptions):
    # Frequency ladder base^(-l/levels) of the RoPE that STRING starts from; 100 as rope.py.
    base: float = 100.0


class STRINGLayer(LayerEncoding):
    """z -> R(r) z for queries and keys, each with its own layout (they may differ).

    Subclasses give ``generators``: the position-independent parts, computed once per call
    and shared by q and k: a basis (or None) and (H, P, F) frequency vectors whose angles
    <θ_f, r> (rope_mixed's ``mixed_angles``) drive the rotations; ``encode`` applies R.
    """

    def generators(self) -> tuple[Tensor | None, Tensor]:
        raise NotImplementedError

    def encode(self, z: Tensor, angles: Tensor, basis: Tensor | None) -> Tensor:
        raise NotImplementedError

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        basis, frequencies = self.generators()
        query, key = key_centred_layouts(inputs, frequencies.dtype)
        q_angles = mixed_angles(query, frequencies)
        k_angles = q_angles if key is query else mixed_angles(key, frequencies)
        return self.encode(q, q_angles, basis), self.encode(k, k_angles, basis)


class STRINGEncoding(PositionEncoding):
    """Common base: STRING is translation invariant and keeps the fused kernel."""

    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL})
