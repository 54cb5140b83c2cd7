"""nD-sincos (Wang and Liu, "Translating Math Formula Images to LaTeX Sequences Using Deep
Neural Networks with Sequence-level Training", IJDAR 2021): the model width split evenly
across the P coordinates, each part a 1D sinusoidal embedding (Vaswani et al., "Attention
Is All You Need", arXiv 1706.03762) of its coordinate, added to the input.

CLS: tokens without a position get no embedding. The official PaPE code's sincos
encodes the CLS at position (0, 0), i.e. adds sin(0) = 0 and cos(0) = 1 features to it.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from .base import EncodingOptions, PositionEncoding, PositionLayout, Principle, at_least_float32, geometric_frequencies
from .registry import register


class SinCosOptions(EncodingOptions):
    base: float = Field(10000.0, gt=0.0)  # temperature of the frequency ladder


@register("sincos")
class NDSinCos(PositionEncoding):
    principles = frozenset({Principle.FUSED_KERNEL})
    Options = SinCosOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        pos_dim = self.geometry.pos_dim
        # Each coordinate gets 2 * per_axis channels; leftover channels stay zero.
        per_axis = self.dim // (2 * pos_dim)
        if per_axis == 0:
            raise ValueError(f"sincos needs dim >= 2 * P, got dim={self.dim}, P={pos_dim}")
        self.register_buffer("frequencies", geometric_frequencies(per_axis, self.options.base), persistent=False)

    def features(self, coords: Tensor) -> Tensor:
        """(B, N, P) -> (B, N, 2 * per_axis * P): [cos, sin] of every coordinate in turn."""
        phase = coords.unsqueeze(-1) * self.frequencies  # (B, N, P, F)
        return torch.cat([phase.cos(), phase.sin()], dim=-1).flatten(-2)

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        # The phases from the positions as given, in float32 or wider, and only the embedding
        # cast to the activations' dtype: rounding positions to bf16 first merged 256 and 257
        # (speech frames, translation tokens) and kept 8 bits of a metre or a second; adding a
        # float32 embedding to bf16 activations also made this encoding's residual stream float32.
        # Position-free tokens get no embedding (``where``: their coordinates may be NaN).
        dtype = at_least_float32(layout.coords.dtype, x.dtype)
        emb = torch.where(layout.has_pos.unsqueeze(-1), self.features(layout.coords_or_zero(dtype)), 0.0)
        return torch.cat([x[..., : emb.shape[-1]] + emb.to(x.dtype), x[..., emb.shape[-1] :]], dim=-1)
