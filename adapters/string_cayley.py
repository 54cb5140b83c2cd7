"""Cayley-STRING (STRING, arXiv 2502.02562, Section 3.2, Example 1): z -> RoPE(r) P z, P = (I - S)(I + S)^{-1}.

S is a learnable antisymmetric head_dim x head_dim matrix per layer and head, stored as its
d(d-1)/2 upper-triangle entries (so every stored number is a free parameter); the Cayley
transform of an antisymmetric S is orthogonal. P is computed once per forward pass with a
linear solve, P = (I + S)^{-1}(I - S) (the two factors commute), then applied to q and k.

One solve for all layers: P depends on parameters only, so the first layer of a forward
solves for every layer of the encoding at once ((L, H, d, d), one batched LU factorisation
and solve forward, one backward), kept in the forward's memo (base.per_forward_memo) where
the other layers take their slice. Per layer, a ViT-B step made 12 small solves forward and
12 backward, each a chain of LU kernels that on CUDA costs launches and library overhead, not
arithmetic (12 heads of 64 x 64). On the CPU the values are the same bits, forward and
backward (LAPACK factorises each matrix of a batch on its own; a test checks); CUDA's
libraries may pick another kernel for the larger batch, so there they may differ by rounding.
One behaviour changes: every layer's S gets a gradient in each forward, zero for a layer that
did not run, where alone it would have none. A model compiled whole (``trainer.compile``)
solves once too: its memo is made inside the compiled forward, whose one graph then holds one
solve. Compiled block by block (the point backbones), where a graph holds some of the layers,
and without a forward's memo, each layer solves for its own P (``CayleyBank``); with the
option ``solve: per_layer`` always.

RoPE part: the paper learns its frequencies too ("Learnable frequencies with STRING"). We
learn a full frequency vector per rotation pair (rope_mixed's form, which is the general
product of per-axis RoPEs of Eq. 5 with learnable frequencies), initialised to rope.py's
axial frequencies (base 100). S starts at 0, so P = I and Cayley-STRING starts as axial
RoPE exactly; ``learn_frequencies`` False freezes the RoPE frequencies.

CLS: as in _string.py, R(0) at the centroid of the valid keys; the CLS still gets the
position-free basis change P.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from ._string import BasisPlacement, STRINGEncoding, STRINGLayer, STRINGOptions
from .base import LayerEncoding, PositionLayout, per_forward_memo
from .registry import register
from .rope_mixed import mixed_frequencies, rope_levels


class CayleySTRINGOptions(STRINGOptions):
    learn_frequencies: bool = True
    # How a forward computes the layers' P (module doc): "batched", all layers in one solve by
    # the first layer, or "per_layer", each its own (the form before stop 58, to compare).
    solve: Literal["batched", "per_layer"] = "batched"


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


class CayleyBank:
    """The layers one Cayley-STRING encoding made, so that a forward can turn all their S into
    their P with one batched solve (module doc). A plain object, not a module: the layers are
    registered where the backbone puts them, and this only refers to them."""

    def __init__(self, head_dim: int) -> None:
        self.head_dim = head_dim
        self.layers: list[CayleySTRINGLayer] = []

    def join(self, layer: CayleySTRINGLayer) -> int:
        """Adds ``layer``; returns its index in :meth:`bases`."""
        self.layers.append(layer)
        return len(self.layers) - 1

    def bases(self) -> Tensor:
        """(L, H, d, d): every layer's P, in the order they joined."""
        return cayley(torch.stack([layer.s_upper for layer in self.layers]), self.head_dim)


class CayleySTRINGLayer(STRINGLayer):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        frequencies: Tensor,
        learn_frequencies: bool,
        basis: BasisPlacement,
        bank: CayleyBank | None = None,
    ) -> None:
        super().__init__(basis)
        self.head_dim = head_dim
        self.s_upper = nn.Parameter(torch.zeros(num_heads, head_dim * (head_dim - 1) // 2))
        self.frequencies = nn.Parameter(frequencies, requires_grad=learn_frequencies)
        self.bank = bank
        self.bank_index = None if bank is None else bank.join(self)

    def qk_basis(self) -> Tensor:
        return cayley(self.s_upper, self.head_dim)  # P z first, then the rotation

    def forward_qk_basis(self, layout: PositionLayout) -> Tensor:
        """This layer's slice of the forward's batched solve where ``layout`` carries a memo,
        else P solved alone."""
        memo = per_forward_memo(layout, within_compiled_forward=True)
        if memo is None or self.bank is None:
            return self.qk_basis()
        slot = ("cayley bases", self.bank)  # the bank itself: no id of a freed one can recur
        if slot not in memo:
            # unbind, not an index per layer: its backward stacks the layers' gradients once,
            # where each index's backward would write a zero-filled (L, H, d, d) and add it up
            memo[slot] = self.bank.bases().unbind(0)
        return memo[slot][self.bank_index]

    def rotation_frequencies(self) -> Tensor:
        return self.frequencies


@register("string-cayley")
class CayleySTRING(STRINGEncoding):
    Options = CayleySTRINGOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.levels = rope_levels(self.head_dim, self.geometry.pos_dim, self.name)
        self.bank = CayleyBank(self.head_dim)

    def make_layer(self, layer_index: int) -> LayerEncoding:
        p = self.geometry.pos_dim
        freqs = mixed_frequencies(self.num_heads, p, self.levels, self.options.base, rotate=False)
        options = self.options
        bank = self.bank if options.solve == "batched" else None
        return CayleySTRINGLayer(self.num_heads, self.head_dim, freqs, options.learn_frequencies, options.basis, bank)
