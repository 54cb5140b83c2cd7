"""Cayley-STRING (STRING, arXiv 2502.02562, Section 3.2, Example 1): z -> RoPE(r) P z, P = (I - S)(I + S)^{-1}.

S is a learnable antisymmetric head_dim x head_dim matrix per layer and head, stored as its
d(d-1)/2 upper-triangle entries (so every stored number is a free parameter); the Cayley
transform of an antisymmetric S is orthogonal. P is computed once per forward pass with a
linear solve, P = (I + S)^{-1}(I - S) (the two factors commute), then applied to q and k.

RoPE part: the paper learns its frequencies too ("Learnable frequencies with STRING"). We
learn a full frequency vector per rotation pair (rope_mixed's form, which is the general
product of per-axis RoPEs of Eq. 5 with learnable frequencies), initialised to rope.py's
axial frequencies (base 100). S starts at 0, so P = I and Cayley-STRING starts as axial
RoPE exactly; ``learn_frequencies`` False freezes the RoPE frequencies.

CLS: as in _string.py, R(0) at the centroid of the valid keys; the CLS still gets the
position-free basis change P.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._string import BasisPlacement, STRINGEncoding, STRINGLayer, STRINGOptions
from .base import LayerEncoding
from .registry import register
from .rope_mixed import mixed_frequencies, rope_levels


class CayleySTRINGOptions(STRINGOptions):
    learn_frequencies: bool = True


def cayley(upper: Tensor, dim: int) -> Tensor:
    """(..., d(d-1)/2) upper-triangle entries of S -> orthogonal (..., d, d) (I + S)^{-1}(I - S)."""
    rows, cols = torch.triu_indices(dim, dim, offset=1, device=upper.device)
    s = upper.new_zeros(*upper.shape[:-1], dim, dim)
    s[..., rows, cols] = upper
    s = s - s.transpose(-1, -2)
    eye = torch.eye(dim, dtype=upper.dtype, device=upper.device)
    # I + S is invertible for every antisymmetric S (its eigenvalues are 1 + i lambda), so the
    # solve's singularity check is skipped: on CUDA, linalg.solve reads that check on the
    # host, a synchronisation in every layer's forward; solve_ex computes the same bits.
    return torch.linalg.solve_ex(eye + s, eye - s).result


class CayleySTRINGLayer(STRINGLayer):
    def __init__(
        self, num_heads: int, head_dim: int, frequencies: Tensor, learn_frequencies: bool, basis: BasisPlacement
    ) -> None:
        super().__init__(basis)
        self.head_dim = head_dim
        self.s_upper = nn.Parameter(torch.zeros(num_heads, head_dim * (head_dim - 1) // 2))
        self.frequencies = nn.Parameter(frequencies, requires_grad=learn_frequencies)

    def qk_basis(self) -> Tensor:
        return cayley(self.s_upper, self.head_dim)  # P z first, then the rotation

    def rotation_frequencies(self) -> Tensor:
        return self.frequencies


@register("string-cayley")
class CayleySTRING(STRINGEncoding):
    Options = CayleySTRINGOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.levels = rope_levels(self.head_dim, self.geometry.pos_dim, self.name)

    def make_layer(self, layer_index: int) -> LayerEncoding:
        p = self.geometry.pos_dim
        freqs = mixed_frequencies(self.num_heads, p, self.levels, self.options.base, rotate=False)
        options = self.options
        return CayleySTRINGLayer(self.num_heads, self.head_dim, freqs, options.learn_frequencies, options.basis)
