"""CoPE (Golovneva et al., "Contextual Position Encoding: Learning to Count What's Important",
arXiv 2405.18719), as SaPE² ("A 2D Semantic-Aware Position Encoding for Vision
Transformers", arXiv 2505.09466) Section 2 and Appendix D (``SaPE_unit``) state it, the 1D
relative encoding that SaPE² builds on.

Per layer and head, with q, k the heads' queries and keys and d the head width:

    g_ij = sigmoid(q_i . k_j / sqrt(d))                         gate (Eq. 7)
    p_ij = sum over t with  j <= t  (and t <= i when causal)  of g_it   position (Eq. 8)
    e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]        interpolation
    r_ij = q_i . e[p_ij],   logits = (q_i . k_j + r_ij) / sqrt(d)        (Eq. 3)

Decisions, each from the SaPE² paper:

* The gate scales q . k by 1/sqrt(d): Appendix D computes ``(q * scale) @ k^T``, the ViT
  attention scale; Eq. 7 omits it, but unscaled sigmoids saturate at ViT head widths.
* The bias r enters inside the 1/sqrt(d), as in SaPE²'s Eq. 3 (its RPE form) and Eq. 16
  (its own bias), where Appendix D leaves the scale open ("adding the output to the attention
  computation"). Golovneva et al.'s own listing adds q . e[p] after the 1/sqrt(d) instead.
  The two are one model up to e <-> e / sqrt(d), but not one training: with the same
  learning rate and e's 0.02 initialisation, Adam moves the positional term sqrt(d) times
  more slowly here (4x at the tiny head width 16, 8x at 64). This row keeps SaPE²'s
  placement, so that it and the sape2 row, whose bias is inside by Eq. 16, differ only in
  what SaPE² adds; it is therefore CoPE as SaPE² compares against, not a copy of the CoPE
  paper's language-model code.
* Order: CoPE counts along a token order. Causal (language) use sums from j up to the
  query, exactly Eq. 8. Non-causal use, SaPE²'s "CoPE applied directly to images"
  (Section 5.2, Table 1), is Appendix D's code without a causal mask: the sum runs from j
  to the end of the sequence. ``t <= i`` in the causal case is token order, the same
  order the attention core's causal mask uses, so no gate ever sees a future token.
* The order itself comes from the coordinates, never from token indices: 1-D positions in
  increasing order, grids in raster (row-major, lexicographic) order, which is how SaPE²
  and the paper flatten an image. Permuting tokens together with their coordinates
  therefore permutes the output, and ties (equal coordinates) count together. Irregular
  positions in 2 or more dimensions have no canonical order, so CoPE is n/a there.
* e has ``npos_max`` rows, shared by the heads of a layer (Appendix D's ``pos_emb``), and
  positions beyond npos_max - 1 are clamped, as Appendix D does; the default npos_max is
  the training token count + 1, the largest p the training grid can produce, so longer
  sequences (extrapolation) saturate instead of failing.

CLS and padding never count (their gates are zero) and get no bias, so CLS stays position
free and padding changes nothing for real tokens. The references have no CLS to compare
with: CoPE is a causal language-model encoding, and SaPE²'s Appendix D code runs on the
patch tokens alone. Coordinates enter only through their
order, so a global translation of the positions leaves every logit unchanged; the bias is
content-dependent (context awareness). Directionality and distance decay are learned, not
built in, so they are not claimed; the N x N bias rules out the fused kernel.

On CUDA the bias is computed by one compiled function (``FUSED_COPE``: 15 kernels instead
of 52 operators per layer, forward and backward, counted with Inductor's CPU kernels);
elsewhere eagerly. It still reaches SDPA as an N x N tensor: compiling it makes computing
the bias cheaper, not the attention kernel the principle above names.

No FlexAttention form: a score_mod sees one (query, key) pair, but p_ij is a sum of the
query's gates over every key from j on, so each pair needs a reduction over the whole key
sequence. Computed as an attention against step values (SaPE²'s trick) the positions are
p_i(rank) for every rank, again N x N per head; so CoPE keeps the dense-bias path.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from pydantic import Field
from torch import Tensor, nn

from ._fused import FusedFunction
from .abspos import OptionalAbsPosEncoding
from .base import (
    AttentionInputs,
    EncodingOptions,
    Geometry,
    LayerEncoding,
    PositionLayout,
    Principle,
    init_truncated_normal,
    shared_by_query_chunks,
    shared_per_forward,
)
from .registry import register


class CoPEOptions(EncodingOptions):
    #: number of integer positions with an embedding; None: training token count + 1.
    npos_max: int | None = Field(None, ge=2)
    #: also add a learnable absolute embedding (SaPE² Table 1's "CoPE + APE").
    abspos: bool = False
    init_std: float = Field(0.02, ge=0.0)


def lexicographic_ranks(coords: Tensor, counted: Tensor) -> Tensor:
    """(B, N, P) coordinates and (B, N) flags -> (B, N) ranks: rank_m = the number of counted
    tokens strictly before token m in lexicographic order (first axis most significant), so
    tokens with equal coordinates share a rank.

    By sorting, O(N log N) per sample: comparing every pair instead took several (B, N, N)
    boolean passes per layer, 4.3 GB each at 65,536 tokens, and a chunk of queries
    (harness/attention.py's ``query_chunks``) repeated them for all keys, hundreds of times per
    forward. Stable sorts from the least significant axis up give the lexicographic order;
    a tie group's rank is the count of counted tokens before its first member."""
    batch, n, axes = coords.shape
    order = torch.arange(n, device=coords.device).expand(batch, n)
    for axis in reversed(range(axes)):
        keys = coords[..., axis].gather(1, order)
        order = order.gather(1, keys.argsort(dim=1, stable=True))
    ordered = coords.gather(1, order.unsqueeze(-1).expand(-1, -1, axes))
    starts_group = torch.ones(batch, n, dtype=torch.bool, device=coords.device)
    starts_group[:, 1:] = (ordered[:, 1:] != ordered[:, :-1]).any(-1)
    counted_ordered = counted.gather(1, order).long()
    counted_before = counted_ordered.cumsum(1) - counted_ordered
    # counted_before does not decrease along the order, so the running maximum of its values at
    # group starts is, for every member, the value at its own group's start
    ranks_ordered = torch.where(starts_group, counted_before, 0).cummax(1).values
    return torch.empty_like(ranks_ordered).scatter_(1, order, ranks_ordered)


class CountBins(NamedTuple):
    """Where each key's gate is summed (``summed_into``) and its count read (``read_at``),
    (B, Nk) each: the bins of ``suffix_counts``."""

    summed_into: Tensor
    read_at: Tensor


def count_bins(ranks: Tensor, counted: Tensor) -> CountBins:
    """The bins of keys with ``ranks`` (``lexicographic_ranks``): one per rank, in reversed
    rank order, so that a prefix sum over the bins is Eq. 8's sum over the keys from m on
    (without the two flips of a suffix sum: the same additions in the same order); keys that
    are never counted (CLS, padding) go to one extra bin after all the others, which no count
    reads, so their gates need no zeroing pass."""
    read_at = ranks.shape[-1] - 1 - ranks
    return CountBins(torch.where(counted, read_at, ranks.shape[-1]), read_at)


def suffix_counts(gates: Tensor, bins: CountBins) -> Tensor:
    """p[..., i, m] = sum over counted keys j of gates[..., i, j] * [rank_j >= rank_m].

    gates: (B, H, Nq, Nk). Gates are summed into their bins, and the bins from the highest
    rank down, O(N^2) instead of a (Nk x Nk) matmul.
    """
    summed_into = bins.summed_into[:, None, None, :].expand_as(gates)
    per_bin = gates.new_zeros(*gates.shape[:-1], gates.shape[-1] + 1).scatter_add_(-1, summed_into, gates)
    return per_bin.cumsum(-1).gather(-1, bins.read_at[:, None, None, :].expand_as(gates))


def interpolated_logits(probe: Tensor, table: Tensor, positions: Tensor) -> Tensor:
    """probe . e[p] with e linearly interpolated between integer positions (sape2 Eq. 13-14).

    probe: (B, H, N, d); table: (d, M); positions: (B, H, N, K) -> (B, H, N, K).
    The M dot products with integer embeddings are formed once and then interpolated,
    instead of interpolating d-wide embeddings for every pair. Every step below is a pass
    over N x K per head, which dominates CoPE's cost at large grids, so the index is rounded
    once (truncation, which is floor for p >= 0, with frac as the weight), the upper
    neighbour is read from a table shifted by one (its last entry repeated, where clamped
    positions land), and one lerp mixes the two; at an integer p the weight is 0 and the
    upper value is not used, as with ceil.
    """
    at_integers = probe @ table.to(probe.dtype)  # (B, H, N, M)
    at_next = torch.cat([at_integers[..., 1:], at_integers[..., -1:]], dim=-1)  # e[min(m + 1, M - 1)]
    positions = positions.clamp(0, table.shape[-1] - 1)
    index = positions.long()  # truncation is floor for p >= 0
    low, high = at_integers.gather(-1, index), at_next.gather(-1, index)
    return torch.lerp(low, high, positions.frac().to(probe.dtype))


def causal_keep(n_q: int, n_k: int, device: torch.device) -> Tensor:
    """(Nq, Nk) True where key j is not after query i, aligned as the attention core does."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)


def cope_bias(
    q: Tensor, k: Tensor, table: Tensor, bins: CountBins, query_has_pos: Tensor, key_has_pos: Tensor,
    keep: Tensor | None,
) -> Tensor:  # fmt: skip
    """CoPE's bias r_ij / sqrt(d) (Eq. 3, 7, 8), (B, H, Nq, Nk): the gates of q . k, counted
    over the keys (``bins``: ``count_bins``; ``keep``: the causal mask or None), interpolated
    in ``table`` (d, npos_max), and 0 wherever the query or the key has no position."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    # The gates and their counts in at least float32: a count is a sum of up to Nk gates,
    # and in bf16 p >= 128 keeps no fraction for the interpolation (steps of 1 there),
    # p >= 256 not even its integer. Under CPU bf16 autocast, which leaves cumsum in bf16,
    # the bias was 17 % (14 x 14) and 76 % (32 x 32) off float32's in relative L2; CUDA
    # autocast sums in float32, but bf16 gates left it 1.8 % and 4.1 % off; now 1.0 % and
    # 2.2 %, the rounding of q and k themselves (tests/adapters/test_enc_cope.py).
    counting = torch.promote_types(q.dtype, torch.float32)
    logits = (q * scale) @ k.transpose(-1, -2)  # scaled before the product: one N x N pass fewer
    gates = torch.sigmoid(logits.to(counting))
    if keep is not None:
        gates = gates * keep.to(gates.dtype)
    r = interpolated_logits(q, table, suffix_counts(gates, bins))
    pair = query_has_pos[:, None, :, None] & key_has_pos[:, None, None, :]
    return r * (pair.to(r.dtype) / math.sqrt(q.shape[-1]))  # mask and scale in one pass over r


def _fusable_cope_bias(q, k, table, summed_into, read_at, query_has_pos, key_has_pos, keep):
    return cope_bias(q, k, table, CountBins(summed_into, read_at), query_has_pos, key_has_pos, keep)


#: ``cope_bias`` as one compiled function (``adapters/_fused.py``; "auto": on CUDA). Eager,
#: CoPE's bias is about 15 passes over (B, H, N, N) float32 tensors per layer and as many in
#: the backward (gates, their bins, the cumulative sum, the gathers and the interpolation's
#: floor, fraction and lerp, the mask): on an H200 (11-27) CoPE trained at 4.23x its FLOP
#: bound. Compiled, the elementwise steps join the kernels around the scatter and the scan.
#: Fused results may differ from eager ones by rounding (Inductor's orders of summation, and
#: its own formulas for the fused chain; tests/adapters/test_fused_cope.py bounds it).
FUSED_COPE = FusedFunction(_fusable_cope_bias, "the fused CoPE bias", "cope.FUSED_COPE.chosen('eager')", 64)


class CoPELayer(LayerEncoding):
    tables = frozenset({"pos_emb"})  # position-indexed: optim.table_lr_scale applies
    bias_by_query_chunks = True  # a query's gates are counted over the keys alone

    def __init__(self, head_dim: int, npos_max: int, init_std: float) -> None:
        super().__init__()
        self.pos_emb = nn.Parameter(torch.zeros(head_dim, npos_max))
        init_truncated_normal(self.pos_emb, init_std)

    @staticmethod
    def count_bins_of(inputs: AttentionInputs) -> CountBins:
        """The key layout's count bins: once per forward for every layer (the memo is keyed by
        the key layout), and once per attention call in chunks of queries, whose layouts are
        new ones without that memo (65,536 tokens: 385 chunks per layer would sort them again)."""
        key = inputs.key
        return shared_by_query_chunks(
            inputs, "cope-bins", lambda: shared_per_forward(inputs, "cope-bins", lambda: CoPELayer._count_bins(key))
        )

    @staticmethod
    def _count_bins(key: PositionLayout) -> CountBins:
        counted = key.positioned  # CLS and padding are never counted
        return count_bins(lexicographic_ranks(key.coords.float(), counted), counted)

    def dense_bias_elements(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> int:
        return q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2]  # content gates: every sample's own

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        bins = self.count_bins_of(inputs)
        keep = causal_keep(q.shape[-2], k.shape[-2], q.device) if inputs.causal else None
        has_pos = (inputs.query.has_pos, inputs.key.has_pos)
        eager = lambda: cope_bias(q, k, self.pos_emb, bins, *has_pos, keep)  # noqa: E731
        return FUSED_COPE(eager, q, k, self.pos_emb, *bins, *has_pos, keep)


@register("cope")
class ContextualPosition(OptionalAbsPosEncoding):
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.CONTEXT_AWARENESS})
    Options = CoPEOptions
    # Positions enter only through their order, which scaling them by a positive factor keeps:
    # interpolation cannot change any logit, so extrapolation shows n/a instead of a copy.
    supports_position_interpolation = False

    @classmethod
    def unsupported_reason(cls, geometry: Geometry) -> str | None:
        if geometry.pos_dim > 1 and not geometry.is_grid:
            return "counts along a token order: defined for 1-D positions and raster-ordered grids only"
        return super().unsupported_reason(geometry)

    @property
    def npos_max(self) -> int:
        if self.options.npos_max is not None:
            return self.options.npos_max
        grid = self.geometry.grid_shape
        # Without a grid there is no training length to read; 64 is a common CoPE setting.
        return math.prod(grid) + 1 if grid else 64

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return CoPELayer(self.head_dim, self.npos_max, self.options.init_std)
