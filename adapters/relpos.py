"""Learnable relative-position bias in the style of Shaw et al. ("Self-Attention with Relative
Position Representations", arXiv 1803.02155); CAPE's *relpos* baseline ("CAPE: Encoding
Relative Positions with Continuous Augmented Positional Embeddings", arXiv 2106.03143,
Section 5.2).

Per layer and head, one learnable scalar per clipped integer offset vector:

    bias_hij = T_h[clip(round(r_j - r_i), -w, w)],    T_h has prod_p (2 w_p + 1) entries,

added to the scaled logits. nD offsets index the table jointly (a (2w+1)^P table, not a sum
of per-axis tables), so the bias can be any function of the clipped offset; P <= 3 keeps the
table small. The *difference* r_j - r_i is rounded to the nearest integer (half to even),
so non-integer positions fall into the nearest offset cell and the bias stays exactly
translation invariant for any shift; positions are in the task's units (patches, frames,
seconds, metres), one cell per unit. Offsets beyond the window share the edge cell, as
Shaw et al.'s clipping.

``window``: one int for every axis or one per axis. Default None: the training grid's
extent n_p - 1 per axis (every offset seen in training has its own cell, as Swin's table),
or 16 per axis for irregular positions. Table init: truncated normal, std 0.02 (Swin's).
CLS: rows and columns of tokens without a position get zero bias. Shaw et al. and CAPE's
relpos baseline (speech, translation) have no CLS to compare with.

FlexAttention form (``score_mod``): the cell index of each (query, key) pair is computed
inside the kernel from the coordinates and looks up T_h there; memory stays linear.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .alibi import pair_mask, pairwise_score_mod, query_key_coords
from .base import (
    AttentionInputs,
    EncodingOptions,
    LayerEncoding,
    PositionEncoding,
    Principle,
    ScoreMod,
    first_sample_if_shared,
    shared_per_forward,
)
from .registry import register

IRREGULAR_WINDOW = 16


class RelPosOptions(EncodingOptions):
    window: int | tuple[int, ...] | None = None


class RelPosLayer(LayerEncoding):
    tables = frozenset({"table"})  # position-indexed: optim.table_lr_scale applies
    bias_by_query_chunks = True  # a table entry per pair's offset

    def __init__(self, num_heads: int, window: tuple[int, ...]) -> None:
        super().__init__()
        self.window_cells = tuple(window)
        self.register_buffer("window", torch.tensor(window), persistent=False)
        sizes = [2 * w + 1 for w in window]
        # Row-major strides of the (2w_1+1) x ... x (2w_P+1) table.
        strides = [1] * len(sizes)
        for p in range(len(sizes) - 2, -1, -1):
            strides[p] = strides[p + 1] * sizes[p + 1]
        self.stride_cells = tuple(strides)
        self.register_buffer("strides", torch.tensor(strides), persistent=False)
        cells = strides[0] * sizes[0]
        self.table = nn.Parameter(nn.init.trunc_normal_(torch.empty(num_heads, cells), std=0.02))

    def cell_index(self, inputs: AttentionInputs) -> Tensor:
        """(B, Nq, Nk) table cell of every clipped, rounded offset r_j - r_i."""
        r_q, r_k = query_key_coords(inputs)
        offset = torch.round(r_k.unsqueeze(1) - r_q.unsqueeze(2)).long()  # (B, Nq, Nk, P)
        offset = torch.maximum(torch.minimum(offset, self.window), -self.window) + self.window
        return (offset * self.strides).sum(-1)

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        # The cells depend on positions and the window only: one lookup per forward for all
        # layers (each layer then reads its own table).
        index, pairs = shared_per_forward(inputs, ("relpos-cells", self.window_cells), lambda: self._cells(inputs))
        bias = self.table[:, index].movedim(0, 1)  # (B, H, Nq, Nk)
        return bias * pairs

    def _cells(self, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """``cell_index`` and ``pair_mask``, cut to one sample when every sample shares them."""
        inputs = first_sample_if_shared(inputs)  # a grid's bias is built once, not per sample
        return self.cell_index(inputs), pair_mask(inputs)

    def score_mod(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> ScoreMod:
        table, windows, strides = self.table, self.window_cells, self.stride_cells

        def relpos(h: Tensor, offsets: list[Tensor]) -> Tensor:
            cells = zip(offsets, windows, strides, strict=True)
            cell = sum((torch.round(d).clamp(-w, w) + w) * stride for d, w, stride in cells)
            return table[h, cell.long()]

        return pairwise_score_mod(inputs, relpos)


@register("relpos")
class RelativePositionBias(PositionEncoding):
    principles = frozenset({Principle.TRANSLATION_INVARIANCE})
    pos_dims = frozenset({1, 2, 3})
    Options = RelPosOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.window = self._window()

    def _window(self) -> tuple[int, ...]:
        p = self.geometry.pos_dim
        window = self.options.window
        if window is None:
            grid = self.geometry.grid_shape
            window = tuple(max(n - 1, 0) for n in grid) if grid is not None else IRREGULAR_WINDOW
        if isinstance(window, int):
            window = (window,) * p
        if len(window) != p or min(window) < 0:
            raise ValueError(f"{self.name}: window must be one int >= 0 or {p} of them, got {window}")
        return tuple(window)

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return RelPosLayer(self.num_heads, self.window)
