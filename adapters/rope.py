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

Cost: every layer recomputes the same angles and cos/sin tables from the same layout.
Compiled (``trainer.compile``, on by default on CUDA), AOTAutograd's common-subexpression
elimination merges them into one computation per forward (tests/harness/test_compile.py
checks this), and inductor fuses the rotation of q and of k into the kernels around
them; eager runs pay the per-layer recomputation. RoPE-Mixed and STRING learn their
frequencies per layer, so only the key-centred coordinates are shared there (also by CSE).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from .base import (
    AttentionInputs,
    EncodingOptions,
    LayerEncoding,
    PositionEncoding,
    PositionLayout,
    Principle,
    geometric_frequencies,
    key_centred_layouts,
)
from .registry import register


class RoPEOptions(EncodingOptions):
    # 100 is rope-vit's choice for axial 2D RoPE on patch-unit positions; 10000 is the 1D LM default.
    base: float = Field(100.0, gt=0.0)


def rotate_pairs(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate consecutive pairs (t[2i], t[2i+1]) of the first 2*F channels by the angles.

    t: (B, H, N, E); cos/sin: (B, 1, N, F) with 2F <= E. Remaining channels pass unchanged.

    Written as t * cos' + swap(t) * sin', with cos' = (c, c) and sin' = (-s, s) per pair and
    swap exchanging the two channels of each pair: four passes over the (B, H, N, E) tensor
    (the swap's copy, two products, a sum) where the pairwise form took five (four
    half-width products, a difference and a sum, then the stack and the concatenation, each
    a copy). The products are rounded before the sum exactly as in the pairwise form (a
    fused multiply-add would round once, changing results by an ulp and with them every
    stored rope record), so both forms give the same bits in every dtype (tested). Eager GPU
    runs pay per pass over q and k (RoPE: 1.48x nopos's training step on an H200 with the
    pairwise form, issue 16; this form is not yet measured on a GPU).
    """
    rotated = 2 * cos.shape[-1]
    head = t if rotated == t.shape[-1] else t[..., :rotated]
    cos_pairs = cos.repeat_interleave(2, dim=-1)  # (.., N, 2F): small, the tables' size
    sin_pairs = torch.stack([-sin, sin], dim=-1).flatten(-2)
    swapped = head.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    out = head * cos_pairs + swapped * sin_pairs
    return out if rotated == t.shape[-1] else torch.cat([out, t[..., rotated:]], dim=-1)


def rotation_angles(layout: PositionLayout, frequencies: Tensor) -> Tensor:
    """(B, N, P) positions x (P, F) per-axis frequencies -> (B, 1, N, P*F) angles, 0 if no position.

    ``frequencies`` may also be (H, P, F) per head; the result is then (B, H, N, P*F).
    """
    coords = layout.coords.to(frequencies.dtype) * layout.has_pos.unsqueeze(-1)
    if frequencies.ndim == 2:
        return (coords.unsqueeze(-1) * frequencies).flatten(-2).unsqueeze(1)
    return torch.einsum("bnp,hpf->bhnpf", coords, frequencies).flatten(-2)


class RotaryLayer(LayerEncoding):
    """Shared (parameter-free) rotation applied in every layer."""

    def __init__(self, frequencies: Tensor) -> None:
        super().__init__()
        self.register_buffer("frequencies", frequencies, persistent=False)

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        # Rotating positions measured from the mean key keeps patch-patch scores unchanged
        # (only r_j - r_i matters) and makes the unrotated CLS sit at the centre of the
        # tokens rather than at the absolute origin, so shifting every patch changes nothing.
        query, key = key_centred_layouts(inputs, self.frequencies.dtype)
        q_angle = rotation_angles(query, self.frequencies)
        k_angle = q_angle if key is query else rotation_angles(key, self.frequencies)
        q = rotate_pairs(q, q_angle.cos().to(q.dtype), q_angle.sin().to(q.dtype))
        k = rotate_pairs(k, k_angle.cos().to(k.dtype), k_angle.sin().to(k.dtype))
        return q, k


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
