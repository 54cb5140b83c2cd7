"""Axial RoPE (Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding",
arXiv 2104.09864; for nD, Chu et al., "VisionLLaMA: A Unified LLaMA Backbone for Vision
Tasks", arXiv 2403.00522, and Heo et al., "Rotary Position Embedding for Vision
Transformer", arXiv 2403.13298).

The head is split into P equal groups of rotation pairs, one group per coordinate; pair k
of a group rotates by coord * base^(-k / pairs_per_axis). Scores between positioned
tokens depend on positions only through r_j - r_i.

CLS: tokens without position get the identity rotation in a frame centred on the mean
position of the valid positioned keys (see ``RotaryLayer``), i.e. the CLS behaves like a
token at that centroid. Its logits with a patch therefore depend on the patch's offset
from the centroid of the *valid keys*: masking keys (padding, dropped tokens, another key
set in cross-attention) moves the centroid and changes the CLS's logits, though not the
logits between patches. Heo et al.'s code (rope-vit) leaves the CLS unrotated with patch
positions from 0, i.e. at the top-left patch's position; the official PaPE code rotates
every token with the CLS at (0, 0) and patches at (1..W, 1..H).

Cost: the rotation tables (cos' and sin', see ``rotate``) depend on positions only, so
one set per forward serves every layer, and q and k in self-attention: eager runs keep
them in the forward's memo (``shared_per_forward``); compiled runs (``trainer.compile``,
on by default on CUDA) get the same sharing from AOTAutograd's common-subexpression
elimination (tests/harness/test_compile.py checks this), and inductor fuses the rotation
of q and of k into the kernels around them. Eager CUDA runs compile the rotation alone
(``rotate_both``: one pass per tensor instead of four). RoPE-Mixed and STRING learn their
frequencies per layer, so only the key-centred coordinates are shared there.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from ._fused import KERNEL_CHOICES, FusedFunction, KernelChoice
from .base import (
    AttentionInputs,
    EncodingOptions,
    LayerEncoding,
    PositionEncoding,
    PositionLayout,
    Principle,
    geometric_frequencies,
    key_centred_layouts,
    shared_per_forward,
)
from .registry import register


class RoPEOptions(EncodingOptions):
    # 100 is rope-vit's choice for axial 2D RoPE on patch-unit positions; 10000 is the 1D LM default.
    base: float = Field(100.0, gt=0.0)


class RotationTables(NamedTuple):
    """Per-channel tables of a rotation of consecutive pairs, in the dtype of the rotated
    tensor: (B, 1 or H, N, E) each, cos' = (c, c) and sin' = (-s, s) for each of the F
    rotated pairs, then 1 and 0 for the E - 2F channels that pass unchanged."""

    cos: Tensor
    sin: Tensor


def rotation_tables(angles: Tensor, dtype: torch.dtype, width: int) -> RotationTables:
    """(B, 1 or H, N, F) angles -> the tables ``rotate`` applies to ``width`` channels, in ``dtype``."""
    return pair_tables(angles.cos().to(dtype), angles.sin().to(dtype), width)


def pair_tables(cos: Tensor, sin: Tensor, width: int) -> RotationTables:
    """Per-pair cosines and sines (B, 1 or H, N, F), 2F <= ``width`` -> per-channel tables
    (c, c) and (-s, s), padded with 1 and 0 to ``width`` channels."""
    unrotated = width - 2 * cos.shape[-1]
    if unrotated < 0:
        raise ValueError(f"{cos.shape[-1]} rotation pairs need at least {2 * cos.shape[-1]} channels, got {width}")
    cos_table = cos.repeat_interleave(2, dim=-1)
    sin_table = torch.stack([-sin, sin], dim=-1).flatten(-2)
    if unrotated:
        cos_table, sin_table = F.pad(cos_table, (0, unrotated), value=1.0), F.pad(sin_table, (0, unrotated))
    return RotationTables(cos_table, sin_table)


def rotate(t: Tensor, tables: RotationTables) -> Tensor:
    """Rotate consecutive pairs (t[2i], t[2i+1]) of t (B, H, N, E) by the tables' angles; the
    channels whose tables hold 1 and 0 pass unchanged (t * 1 + swap(t) * 0 = t exactly).

    Written as t * cos' + swap(t) * sin', swap exchanging the two channels of each pair: four
    passes over the (B, H, N, E) tensor (the swap's copy, two products, a sum) where the
    pairwise form took five (four half-width products, a difference and a sum, then the
    stack and the concatenation, each a copy). The products are rounded before the sum
    exactly as in the pairwise form (a fused multiply-add would round once, changing
    results by an ulp and with them every stored rope record), so both forms give the same
    bits in every dtype (tested). Eager GPU runs pay per pass over q and k (RoPE's training
    step on an H200: 1.48x nopos's with the pairwise form, 1.22x with this one and the
    tables shared per forward), so on CUDA ``rotate_both`` runs these passes as one
    compiled function.

    Channels that pass unchanged (E > 2F: 3-D positions, whose E // 6 pairs per axis leave
    E mod 6 over, and Circulant-STRING's DC and Nyquist rows) ride along in the same passes
    rather than being sliced off and concatenated back: the concatenation was a copy of q
    and of k, and it gave them the (B, H, N, E) memory order, so their gradients needed two
    more copies on the way back to the projection's (B, N, H, E) layout, besides the
    slices' own backward (per layer, ten passes over a (B, H, N, E) tensor for those).
    """
    width = _checked_width(t, tables)
    if width % 2:  # an odd head: its last channel has no partner to swap with, and never rotates
        even = RotationTables(tables.cos[..., :-1], tables.sin[..., :-1])
        return torch.cat([rotate(t[..., :-1], even), t[..., -1:]], dim=-1)
    return _rotate_channels(t, tables.cos, tables.sin)


def _checked_width(t: Tensor, tables: RotationTables) -> int:
    """t's channel count, which ``tables`` must match."""
    if tables.cos.shape[-1] != t.shape[-1]:
        raise ValueError(f"rotation tables of {tables.cos.shape[-1]} channels for a tensor of {t.shape[-1]}")
    return t.shape[-1]


def _rotate_channels(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """t * cos' + swap(t) * sin' for an even width: the arithmetic of ``rotate``."""
    swapped = t.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return t * cos + swapped * sin


def rotate_pairs(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``rotate`` by (B, 1 or H, N, F) cosines and sines in t's dtype (one-off rotations)."""
    return rotate(t, pair_tables(cos, sin, t.shape[-1]))


def rotate_qk(q: Tensor, k: Tensor, q_angles: Tensor, k_angles: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate q and k by their angles; one set of tables serves both in self-attention."""
    q_tables = rotation_tables(q_angles, q.dtype, q.shape[-1])
    k_tables = q_tables if k_angles is q_angles else rotation_tables(k_angles, k.dtype, k.shape[-1])
    return rotate_both(q, k, q_tables, k_tables)


def _rotate_two(q: Tensor, k: Tensor, q_cos: Tensor, q_sin: Tensor, k_cos: Tensor, k_sin: Tensor):
    return _rotate_channels(q, q_cos, q_sin), _rotate_channels(k, k_cos, k_sin)


#: the rotation of q and k as one compiled function (``rotate_both``); ``FUSED_ROTATION.chosen``
#: ("auto": fused on CUDA) is ``pe-bench bench --rotation-kernel``. Its variants: one per dtype,
#: layout and grad mode, and shapes beyond the first become dynamic (Dynamo's default of 8 is
#: soon reached by a grid that trains in bf16 and evaluates at several resolutions)
FUSED_ROTATION = FusedFunction(_rotate_two, "the fused rotation", "rope.rotation_kernel('eager')", 64)
rotation_kernel = FUSED_ROTATION.chosen
RotationKernel = KernelChoice
ROTATION_KERNELS = KERNEL_CHOICES


def rotate_both(q: Tensor, k: Tensor, q_tables: RotationTables, k_tables: RotationTables) -> tuple[Tensor, Tensor]:
    """``rotate(q, q_tables), rotate(k, k_tables)``; on CUDA as one compiled function.

    Eager, each rotation is four passes over its tensor (the swap's gather, two products,
    a sum) and as many in the backward, on q and k that are strided views of the fused qkv
    projection, which PyTorch's elementwise kernels read unvectorised. Profiled on an H100
    (11-28, ViT-B/16 at batch 128, bf16, three training steps): 31 ms of CUDA time over
    nopos's 146 ms, of which 18 ms in the products and 8 ms in the swap; RoPE trained at
    1.22x nopos. Compiled, Inductor computes each output in one pass that reads t, its swap
    (an index, not a copy) and the tables, and the backward likewise; where the whole model
    is compiled (``trainer.compile``) this is already the case and the plain arithmetic is
    traced instead. Compiled with pe-bench's Inductor options (``_fused.INDUCTOR_OPTIONS``),
    the 16-bit intermediates round where eager rounds: the forward gave eager's bits in bf16
    on the CPU (stop 58); gradients may differ in the last bit (orders of summation).
    """
    q_width, k_width = _checked_width(q, q_tables), _checked_width(k, k_tables)
    eager = lambda: (rotate(q, q_tables), rotate(k, k_tables))  # noqa: E731
    if q_width % 2 or k_width % 2:
        return eager()  # odd heads keep rotate's slicing
    return FUSED_ROTATION(eager, q, k, q_tables.cos, q_tables.sin, k_tables.cos, k_tables.sin)


def rotation_angles(layout: PositionLayout, frequencies: Tensor) -> Tensor:
    """(B, N, P) positions x (P, F) per-axis frequencies -> (B, 1, N, P*F) angles, 0 if no position.

    ``frequencies`` may also be (H, P, F) per head; the result is then (B, H, N, P*F).
    """
    coords = layout.coords_or_zero(frequencies.dtype)
    if frequencies.ndim == 2:
        return (coords.unsqueeze(-1) * frequencies).flatten(-2).unsqueeze(1)
    # A broadcast product, not einsum: CUDA's autocast runs einsum in bf16, which rounded
    # RoPE-Mixed's and STRING's angles (tens of radians on a 64 x 64 grid) to 0.06-0.25 rad;
    # rope-vit computes them with autocast off. Without a contraction the float32 bits are einsum's.
    return (coords[:, None, :, :, None] * frequencies[None, :, None]).flatten(-2)


class RotaryLayer(LayerEncoding):
    """Shared (parameter-free) rotation applied in every layer."""

    def __init__(self, frequencies: Tensor) -> None:
        super().__init__()
        self.register_buffer("frequencies", frequencies, persistent=False)

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        tables = lambda: self.angle_tables(inputs, q.dtype, q.shape[-1])  # noqa: E731
        q_tables, k_tables = shared_per_forward(inputs, ("rope", self, q.dtype, q.shape[-1]), tables)
        return rotate_both(q, k, q_tables, k_tables)

    def angle_tables(
        self, inputs: AttentionInputs, dtype: torch.dtype, width: int
    ) -> tuple[RotationTables, RotationTables]:
        """The query's and the key's rotation tables, once per forward for all layers."""
        # Rotating positions measured from the mean key keeps patch-patch scores unchanged
        # (only r_j - r_i matters) and makes the unrotated CLS sit at the centre of the
        # tokens rather than at the absolute origin, so shifting every patch changes nothing.
        query, key = key_centred_layouts(inputs, self.frequencies.dtype)
        q_tables = rotation_tables(rotation_angles(query, self.frequencies), dtype, width)
        if key is query:
            return q_tables, q_tables
        return q_tables, rotation_tables(rotation_angles(key, self.frequencies), dtype, width)


@register("rope")
class AxialRoPE(PositionEncoding):
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL})
    Options = RoPEOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        pairs_per_axis = self.head_dim // (2 * self.geometry.pos_dim)
        if pairs_per_axis == 0:
            raise ValueError(f"rope needs head_dim >= 2 * P, got {self.head_dim} for P={self.geometry.pos_dim}")
        freqs = geometric_frequencies(pairs_per_axis, self.options.base)
        # One row per axis; off-axis entries are zero, so pair groups are axis-aligned.
        self._frequencies = freqs.expand(self.geometry.pos_dim, -1).clone()
        self._layer = RotaryLayer(self._frequencies)

    def make_layer(self, layer_index: int) -> LayerEncoding:
        # The rotation has no parameters, so all layers share one module.
        return self._layer
