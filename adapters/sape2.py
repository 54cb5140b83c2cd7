"""SaPE²: 2D Semantic-aware Position Encoding (Chen et al., "A 2D Semantic-Aware Position
Encoding for Vision Transformers", arXiv 2505.09466, Section 3, Appendix D).

CoPE (adapters/cope.py) run along each image axis, then compared across the image. For
the x axis (rows share y), with d the head width and the probe v_i = q_i (``mode="q"``,
SaPE²(Q)) or k_i (``mode="k"``, SaPE²(K), the paper's best, Table 2):

    g_ij = sigmoid(q_i . k_j / sqrt(d))              for j in i's row         (Eq. 9)
    p_i(c) = sum of g_ij over j in i's row with x_j >= c,   c = 1..W          (Eq. 10)
    z_i(c) = v_i . e^x[p_i(c)],  e^x linearly interpolated (Eq. 11-14)
    SaPE_x[i] = (z_i(1), ..., z_i(W))                                         (Eq. 12)
    b^x_in = || SaPE_x[i] - SaPE_x[n] ||_2             for any two patches    (Eq. 15)

the same along y with columns, and logits (q_i . k_n + b^x_in + b^y_in) / sqrt(d) (Eq. 16).

Decisions:

* As in CoPE, gates use the attention scale (Appendix D's ``q * scale``) and the bias sits
  inside Eq. 16's 1/sqrt(d). Eq. 16 adds the distance as written (no sign flip): the
  learned embeddings decide what a large semantic distance means.
* p_i(c) is evaluated at every column c of the grid, not only where a token sits: a row
  with masked or missing cells still yields a W-vector, and the vectors of two patches
  in different rows stay aligned column by column, as Eq. 15 needs.
* Rows, columns and the index c come from the coordinates (rounded cell indices relative
  to the smallest positioned coordinate), never from token order: a global translation
  of the grid changes nothing, and permuting tokens with their coordinates permutes the
  output. W and H are the layout's current grid, so a larger grid gives longer vectors
  and positions beyond ``npos_max - 1`` clamp as in Appendix D (extrapolation).
* npos_max defaults to max(grid) + 1: p ranges over 0..W on the training grid.
* Eq. 15 compares the SaPE vectors of two tokens of one set, each computed with that
  token's own query, so SaPE² is a self-attention encoding: query and key layouts may be
  different objects but must describe the same tokens; other pairs raise
  NotApplicableError (cross-attention n/a). In causal use gates never see a
  token after the query (token order, as the attention core's mask).
* ``abspos`` adds the learnable absolute embedding of adapters/abspos.py (the paper's
  best model, "SaPE² + APE", Table 1).

CLS and padding never count in the gates and get no bias (Appendix D's code takes a square
grid of patch tokens only, seq_len = H W, so the paper's CLS handling is not shown). The bias depends on the
positions only through equal rows/columns and column/row offsets from the grid's origin,
so it is invariant to global translations; it is content-dependent (context awareness).
It is symmetric in (i, n) and vanishes for constant content, so neither directionality
nor distance decay is guaranteed or claimed; the N x N bias rules out the fused kernel.

FlexAttention form (``score_mod``, used on CUDA): nothing N x N is stored. The counts
p_i(c) of Eq. 10 are themselves an attention: sum_j g_ij v_j with g_ij = sigmoid(q_i . k_j
/ sqrt(d)) on the query's row and step values v_j(c) = [x_j >= c]. FlexAttention with the
score exp(log sigmoid) on the row (and -inf elsewhere) returns that sum divided by sum_j
g_ij, and its log-sum-exp is log sum_j g_ij, so p = output * exp(lse), in float32. The SaPE
vectors (B, H, N, W + H) then enter the score_mod, which forms Eq. 15's two distances per
(query, key) pair in the kernel (W + H terms each).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from ._flex import indexed_once, run_flex
from .abspos import OptionalAbsPosEncoding
from .base import (
    AttentionInputs,
    EncodingOptions,
    LayerEncoding,
    NotApplicableError,
    PositionLayout,
    Principle,
    ScoreMod,
    init_truncated_normal,
    shared_per_forward,
)
from .cope import causal_keep, interpolated_logits
from .registry import register


class SaPE2Options(EncodingOptions):
    mode: Literal["k", "q"] = "k"
    abspos: bool = False
    #: number of integer positions with an embedding per axis; None: max(grid) + 1.
    npos_max: int | None = Field(None, ge=2)
    init_std: float = Field(0.02, ge=0.0)


def cell_indices(layout: PositionLayout) -> tuple[Tensor, tuple[int, int]]:
    """(B, N, 2) integer (row, col) relative to the smallest positioned cell, and (H, W)."""
    coords = layout.coords.float()
    big = torch.finfo(coords.dtype).max
    origin = coords.masked_fill(~layout.positioned.unsqueeze(-1), big).amin(1, keepdim=True)
    origin = torch.where(origin == big, torch.zeros_like(origin), origin)  # nothing positioned
    cells = (coords - origin).round().long()
    if layout.grid_shape is not None:
        shape = tuple(int(n) for n in layout.grid_shape)
    else:
        span = cells.masked_fill(~layout.positioned.unsqueeze(-1), 0).amax(dim=(0, 1)) + 1
        shape = tuple(int(n) for n in span.tolist())
    limit = torch.tensor(shape, device=cells.device) - 1
    return cells.clamp(min=torch.zeros_like(limit), max=limit), shape


class GridLines:
    """SaPE²'s position-only inputs of one attention call, each made on first use: every
    layer of a forward asks for the same ones, so :func:`grid_lines` hands the layers one
    object from the forward's memo and each mask below is computed once per forward, not per
    layer (issue 16: positional features computed once per forward; the same bits).

    ``rows``, ``cols``: (B, N) each token's cell (``cell_indices``); ``height``, ``width``:
    the grid's.
    """

    def __init__(self, inputs: AttentionInputs) -> None:
        self._layout, self._causal = inputs.query, inputs.causal
        cells, (self.height, self.width) = cell_indices(inputs.query)
        self.rows, self.cols = cells[..., 0], cells[..., 1]
        self._made: dict[tuple, Tensor] = {}

    def _once(self, name: tuple, compute) -> Tensor:
        if name not in self._made:
            self._made[name] = compute()
        return self._made[name]

    def axis(self, axis: str) -> tuple[Tensor, Tensor, int]:
        """(line, along, length) of an axis: for "x", each token's row (the tokens it is
        counted with), its column (its index c) and the grid's width; "y" the other way."""
        if axis == "x":
            return self.rows, self.cols, self.width
        return self.cols, self.rows, self.height

    def counted_keys(self, n_q: int, dtype: torch.dtype) -> Tensor:
        """(B, 1, Nq or 1, N) 1 where a key's gate counts (positioned; causal: not after the
        query), else 0."""

        def compute() -> Tensor:
            keep = self._layout.positioned[:, None, None, :]
            if self._causal:
                keep = keep & causal_keep(n_q, keep.shape[-1], keep.device)
            return keep.to(dtype)

        return self._once(("counted", n_q, dtype), compute)

    def same_line(self, axis: str, dtype: torch.dtype) -> Tensor:
        """(B, 1, N, N) 1 where two tokens share the axis's line (a row for "x")."""
        line = self.axis(axis)[0]

        def compute() -> Tensor:
            return (line.unsqueeze(2) == line.unsqueeze(1))[:, None].to(dtype)

        return self._once(("same-line", axis, dtype), compute)

    def reversed_cells(self, axis: str) -> Tensor:
        """(B, 1, 1, N) each token's index along the axis counted from the far end
        (length - 1 - c): scattering into it lays the per-cell sums out reversed, ready
        for the suffix sum's cumsum, which saves a flip per axis and layer."""
        _, along, length = self.axis(axis)
        return self._once(("reversed", axis), lambda: (length - 1 - along)[:, None, None, :])

    def steps(self, axis: str, dtype: torch.dtype) -> Tensor:
        """(B, 1, N, width) Flex's step values v_j(c) = [c_j >= c] of the axis, widened to a
        power of two >= 16 (what the CUDA kernels take); c_j < length (``cell_indices``
        clamps), so the extra columns are zero."""
        _, along, length = self.axis(axis)
        width = max(16, 1 << (length - 1).bit_length())
        return self._once(
            ("steps", axis, dtype),
            lambda: (along.unsqueeze(-1) >= torch.arange(width, device=along.device)).to(dtype).unsqueeze(1),
        )

    def positioned_rows(self, dtype: torch.dtype) -> Tensor:
        """(B, 1, N, 1) 1 for a token with a position: its SaPE vector's mask."""
        return self._once(("has-pos", dtype), lambda: self._layout.has_pos[:, None, :, None].to(dtype))

    def positioned_pairs(self, dtype: torch.dtype) -> Tensor:
        """(B, 1, N, N) 1 where both tokens have a position: where the bias may be non-zero."""
        has_pos = self._layout.has_pos

        def compute() -> Tensor:
            return (has_pos[:, None, :, None] & has_pos[:, None, None, :]).to(dtype)

        return self._once(("pairs", dtype), compute)


def grid_lines(inputs: AttentionInputs) -> GridLines:
    """The forward's :class:`GridLines` (one for all layers; a new one without a memo)."""
    return shared_per_forward(inputs, ("sape2-lines", inputs.causal), lambda: GridLines(inputs))


class SaPE2Layer(LayerEncoding):
    tables = frozenset({"emb_x", "emb_y"})  # position-indexed: optim.table_lr_scale applies

    def __init__(self, head_dim: int, npos_max: int, options: SaPE2Options) -> None:
        super().__init__()
        self.mode = options.mode
        # One embedding table per axis (Appendix D's sape_x and sape_y), shared by heads.
        self.emb_x = nn.Parameter(torch.zeros(head_dim, npos_max))
        self.emb_y = nn.Parameter(torch.zeros(head_dim, npos_max))
        init_truncated_normal(self.emb_x, options.init_std)
        init_truncated_normal(self.emb_y, options.init_std)

    @staticmethod
    def _check_self_attention(inputs: AttentionInputs) -> None:
        query, key = inputs.query, inputs.key
        if key is query:
            return
        same = (
            query.coords.shape == key.coords.shape
            and torch.equal(query.coords, key.coords)
            and torch.equal(query.has_pos, key.has_pos)
        )
        if not same:
            raise NotApplicableError(
                "sape2 compares SaPE vectors of two tokens of one set (Eq. 15), each built from its own "
                "query: it needs self-attention, but the query and key layouts describe different tokens"
            )

    def axis_vectors(self, gates: Tensor, probe: Tensor, lines: GridLines, axis: str, table: Tensor) -> Tensor:
        """SaPE vectors along one axis (Eq. 10-14): (B, H, N, length).

        gates: (B, H, N, N) with uncounted keys zeroed; ``axis`` "x" counts each query's
        gates over the keys in its row, cell by cell of their columns.
        """
        length = lines.axis(axis)[2]
        in_line = gates * lines.same_line(axis, gates.dtype)
        index = lines.reversed_cells(axis).expand_as(in_line)
        per_cell = torch.zeros(*in_line.shape[:-1], length, dtype=in_line.dtype, device=in_line.device)
        # per cell, far end first: each cell receives the same sums in the same order as
        # when laid out forwards and flipped (the same bits, one pass fewer)
        per_cell = per_cell.scatter_add_(-1, index, in_line)
        positions = per_cell.cumsum(-1).flip(-1)  # p_i(c) = sum over x_j >= c
        return interpolated_logits(probe, table, positions)

    def flex_axis_vectors(
        self, q: Tensor, k: Tensor, inputs: AttentionInputs, lines: GridLines, axis: str, table: Tensor
    ) -> Tensor:
        """``axis_vectors`` without N x N tensors (see module doc): (B, H, N, length)."""
        counted, causal = inputs.query.positioned, inputs.causal
        line, _, length = lines.axis(axis)
        dtype = torch.promote_types(q.dtype, torch.float32)
        values = lines.steps(axis, dtype).expand(-1, q.shape[1], -1, -1)

        def on_line(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            keep = counted[b, j] & (line[b, j] == line[b, i])
            if causal:
                keep = keep & (j <= i)
            return torch.where(keep, F.logsigmoid(score), float("-inf"))

        scale = 1.0 / math.sqrt(q.shape[-1])
        mean, lse = run_flex(q.to(dtype), k.to(dtype), values, on_line, scale=scale, return_lse=True)
        # A query with nothing on its line: 0 * exp(-inf) = 0.
        positions = mean[..., :length] * lse.exp().unsqueeze(-1)
        return interpolated_logits(k if self.mode == "k" else q, table, positions)

    def dense_bias_elements(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> int:
        return q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2]  # content gates: every sample's own

    def score_mod(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> ScoreMod:
        self._check_self_attention(inputs)
        lines = grid_lines(inputs)
        vec_x = self.flex_axis_vectors(q, k, inputs, lines, "x", self.emb_x)
        vec_y = self.flex_axis_vectors(q, k, inputs, lines, "y", self.emb_y)
        return vector_distance_score_mod([vec_x, vec_y], inputs.query.has_pos, 1.0 / math.sqrt(q.shape[-1]))

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        self._check_self_attention(inputs)
        lines = grid_lines(inputs)

        # gates and counts in at least float32, as the Flex form's (cope.py's ``positions``: in
        # 16 bits a count loses its fraction, which the interpolation reads)
        logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        gates = torch.sigmoid(logits.to(torch.promote_types(q.dtype, torch.float32)))
        gates = gates * lines.counted_keys(q.shape[-2], gates.dtype)

        probe = k if self.mode == "k" else q
        vec_x = self.axis_vectors(gates, probe, lines, "x", self.emb_x)
        vec_y = self.axis_vectors(gates, probe, lines, "y", self.emb_y)

        # Tokens without a position get zero vectors here and zero bias below.
        has_pos = lines.positioned_rows(vec_x.dtype)
        vec_x, vec_y = vec_x * has_pos, vec_y * has_pos
        dist_x = torch.cdist(vec_x, vec_x, compute_mode="donot_use_mm_for_euclid_dist")
        dist_y = torch.cdist(vec_y, vec_y, compute_mode="donot_use_mm_for_euclid_dist")
        return (dist_x + dist_y) * lines.positioned_pairs(dist_x.dtype) / math.sqrt(q.shape[-1])


def _safe_sqrt(x: Tensor) -> Tensor:
    """sqrt with gradient 0 instead of NaN at 0 (a token's distance to itself), as cdist's."""
    positive = x > 0
    return torch.where(positive, torch.where(positive, x, 1.0).sqrt(), 0.0)


def vector_distance_score_mod(vectors: list[Tensor], has_pos: Tensor, scale: float) -> ScoreMod:
    """score + scale * sum over ``vectors`` of ||v[i] - v[j]||_2 for two positioned tokens.

    vectors: (B, H, N, L_v) each; the L_v squared differences are unrolled in the kernel.
    Each column is read at the query and at the key, from two copies of it, so that every
    tensor the score_mod indexes is indexed once (_flex.indexed_once: Inductor's backward
    takes nothing else).
    """
    at_query = [indexed_once(vec) for vec in vectors]
    at_key = [indexed_once(vec) for vec in vectors]

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        total = 0.0
        for query_cols, key_cols in zip(at_query, at_key, strict=True):
            squared = sum((v_i[b, h, i] - v_j[b, h, j]).square() for v_i, v_j in zip(query_cols, key_cols, strict=True))
            total = total + _safe_sqrt(squared)
        return score + torch.where(has_pos[b, i] & has_pos[b, j], total * scale, 0.0).to(score.dtype)

    return score_mod


@register("sape2")
class SaPE2(OptionalAbsPosEncoding):
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.CONTEXT_AWARENESS})
    requires_grid = True
    pos_dims = frozenset({2})
    Options = SaPE2Options
    # Positions enter as rounded cell indices (Eq. 9-10's lines and cells): scaled by 0.5 they
    # round unevenly onto fewer rows and columns (144 patches of 12 x 12 onto 49 cells), a
    # merge, not an interpolation, so extrapolation shows n/a.
    supports_position_interpolation = False

    @property
    def npos_max(self) -> int:
        if self.options.npos_max is not None:
            return self.options.npos_max
        return max(self.geometry.grid_shape) + 1

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return SaPE2Layer(self.head_dim, self.npos_max, self.options)
