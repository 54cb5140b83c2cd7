"""nD-sincos (Wang and Liu, "Translating Math Formula Images to LaTeX Sequences Using Deep
Neural Networks with Sequence-level Training", IJDAR 2021): the model width split evenly
across the P coordinates, each part a 1D sinusoidal embedding (Vaswani et al., "Attention
Is All You Need", arXiv 1706.03762) of its coordinate, added to the input.

CLS: tokens without a position get no embedding. The official PaPE code's sincos
encodes the CLS at position (0, 0), i.e. adds sin(0) = 0 and cos(0) = 1 features to it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import EncodingOptions, PositionEncoding, PositionLayout, Principle, geometric_frequencies
from .registry import register


class SinCosOptions(EncodingOptions):
    base: float = 10000.0  # temperature of the frequency ladder


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
        emb = self.features(layout.coords.to(x.dtype)) * layout.has_pos.unsqueeze(-1).to(x.dtype)
        return torch.cat([x[..., : emb.shape[-1]] + emb, x[..., emb.shape[-1] :]], dim=-1)
