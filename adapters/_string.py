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

Where B is applied: B is position-free, so B q = (B W_q) x + B b_q, and the attention core can
fold it into the q and k projections once per forward (the paper absorbs P this way at
inference; the gradients flow through the product in training as well), instead of a
(d x d) product per token for q and for k with its layout copies and their backward. The
option ``basis`` chooses: "folded", "per_token" (the reference), or "auto" (default): folded
on CUDA, per token on CPU. The two differ by rounding only (tests/harness/test_qk_basis.py,
and the conformance suite for any encoding with a ``qk_basis``), but rounding is enough to
change float32 training to the bit: the stored records of both STRINGs were trained per
token on CPU, and "auto" keeps that arithmetic there. Bytes written per image by a bf16
ViT-B/16 training step (CPU, ``OperatorCounter``, slope between batch 4 and 16): per token
string-cayley 230 MiB, string-circulant 244; folded 206 for both, rope-mixed's figure.

Both q/k transforms keep the head width and build no N x N tensor (fused-kernel friendly).
Tokens without a position get R(0) = I, after the position-free basis change (P or F).
As in rope_mixed, positions are first taken relative to the mean positioned key (exact for
positioned pairs), so the CLS sits at the key centroid, not at the absolute origin, and a
translation of all positions changes no logit, the CLS's included; masking keys moves the
centroid and so changes the CLS's logits. The paper does not say how its ViTs treat the
CLS.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from .base import AttentionInputs, EncodingOptions, LayerEncoding, PositionEncoding, Principle, key_centred_layouts
from .rope import rotate_qk
from .rope_mixed import mixed_angles

BasisPlacement = Literal["auto", "folded", "per_token"]


def basis_folded(placement: str, device_type: str) -> bool:
    """Whether the ``basis`` option ``placement`` folds B into the projections on a
    ``device_type`` device ("auto": on CUDA only); the FLOP model asks the same."""
    return placement == "folded" or (placement == "auto" and device_type == "cuda")


class STRINGOptions(EncodingOptions):
    # Frequency ladder base^(-l/levels) of the RoPE that STRING starts from; 100 as rope.py.
    base: float = Field(100.0, gt=0.0)
    # Where the basis change B is applied (module doc): folded into the q/k projections,
    # per token, or "auto": folded on CUDA, per token on CPU (the stored records' arithmetic).
    basis: BasisPlacement = "auto"


class STRINGLayer(LayerEncoding):
    """z -> RoPE(r) B z for queries and keys, each with its own layout (they may differ).

    Subclasses give the position-independent parts, computed once per call and shared by q
    and k: ``qk_basis``, the orthogonal B, (H, d, d) per head or (d, d) for all, and
    ``rotation_frequencies``, (H, P, F) frequency vectors whose angles <θ_f, r> (rope_mixed's
    ``mixed_angles``) turn the first F pairs of consecutive channels of B z.
    """

    def __init__(self, basis: BasisPlacement) -> None:
        super().__init__()
        self.basis_placement = basis

    def rotation_frequencies(self) -> Tensor:
        raise NotImplementedError

    def fold_qk_basis(self, device: torch.device) -> bool:
        return basis_folded(self.basis_placement, device.type)

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        frequencies = self.rotation_frequencies()
        if not inputs.qk_in_basis:  # else the core folded B into the projections
            basis = self.forward_qk_basis(inputs.query).to(q.dtype)
            q, k = in_basis(q, basis), in_basis(k, basis)
        query, key = key_centred_layouts(inputs, frequencies.dtype)
        q_angles = mixed_angles(query, frequencies)
        k_angles = q_angles if key is query else mixed_angles(key, frequencies)
        return rotate_qk(q, k, q_angles, k_angles)


def in_basis(z: Tensor, basis: Tensor) -> Tensor:
    """B z for (B, H, N, d) z, B in z's dtype: one matrix product with a shared (d, d)
    basis, one per head with an (H, d, d) basis."""
    if basis.ndim == 2:
        return z @ basis.T
    return torch.einsum("hed,bhnd->bhne", basis, z)


class STRINGEncoding(PositionEncoding):
    """Common base: STRING is translation invariant and keeps the fused kernel."""

    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL})
