"""Learnable absolute position embedding, one vector per grid cell, as in ViT ("An Image is
Worth 16x16 Words", arXiv 2010.11929) and DeiT ("Training data-efficient image transformers
& distillation through attention", arXiv 2012.12877).

On a grid other than the training one the table is resized, bicubically for 2-D grids
(linear for 1-D, trilinear for 3-D), as CAPE ("Encoding Relative Positions with Continuous
Augmented Positional Embeddings", arXiv 2106.03143) Section 5.1 and DeiT do.

CLS: pe-bench gives prefix tokens no positional vector (the protocol keeps them
position-free). ViT and DeiT, and CAPE's abspos baseline, learn one more table entry for
the class token (not interpolated when the grid is resized, CAPE footnote 5).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from .base import EncodingOptions, PositionEncoding, PositionLayout, Principle, init_truncated_normal
from .registry import register

_MODES = {1: "linear", 2: "bicubic", 3: "trilinear"}


class AbsPosOptions(EncodingOptions):
    init_std: float = Field(0.02, ge=0.0)


@register("abspos")
class LearnableAbsolute(PositionEncoding):
    tables = frozenset({"table"})  # position-indexed: optim.table_lr_scale applies

    principles = frozenset({Principle.FUSED_KERNEL})
    requires_grid = True
    supports_position_interpolation = False  # the table is resized bicubically instead
    pos_dims = frozenset(_MODES)
    Options = AbsPosOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        grid = self.geometry.grid_shape
        self.table = nn.Parameter(torch.zeros(1, self.dim, *grid))
        init_truncated_normal(self.table, self.options.init_std)

    def resized_table(self, grid_shape: tuple[int, ...]) -> Tensor:
        """(prod(grid_shape), D) table for the current grid, row-major."""
        table = self.table
        if tuple(grid_shape) != tuple(table.shape[2:]):
            table = F.interpolate(table, size=tuple(grid_shape), mode=_MODES[len(grid_shape)], align_corners=False)
        return table.flatten(2).squeeze(0).T

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        grid = layout.grid_shape
        if grid is None:
            raise ValueError("abspos needs layout.grid_shape: the task must describe its token grid")
        table = self.resized_table(grid)
        # Grid coordinates are cell indices; they select rows of the table. Rounding
        # tolerates float noise, clamping keeps interpolated layouts inside the table.
        index = torch.zeros(layout.coords.shape[:2], dtype=torch.long, device=x.device)
        for axis, size in enumerate(grid):
            stride = math.prod(grid[axis + 1 :])
            cell = layout.coords[..., axis].round().long().clamp(0, size - 1)
            index = index + cell * stride
        emb = table[index] * layout.has_pos.unsqueeze(-1).to(table.dtype)
        return x + emb.to(x.dtype)


class OptionalAbsPosEncoding(PositionEncoding):
    """Base of encodings whose ``abspos`` option also adds the learnable absolute embedding
    above to the inputs (SaPE² Table 1's "CoPE + APE" and "SaPE² + APE"). Its Options need
    an ``abspos: bool`` field. A table indexed by absolute cell breaks translation
    invariance, so an instance with it stops claiming that principle."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.abspos = None
        if self.options.abspos:
            self.abspos = LearnableAbsolute(self.geometry, self.dim, self.num_heads, self.depth, AbsPosOptions())

    def claimed_principles(self) -> frozenset[Principle]:
        if self.abspos is not None:
            return self.principles - {Principle.TRANSLATION_INVARIANCE}
        return self.principles

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        return x if self.abspos is None else self.abspos.embed(x, layout)
