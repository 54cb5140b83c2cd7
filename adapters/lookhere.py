"""LookHere: 2D-ALiBi with directed fields of view per head, as its authors released it.

Reference: Fuller, Kyrollos, Yassin and Green, "LookHere: Vision Transformers with
Directed Attention Generalize and Extrapolate" (NeurIPS 2024, arXiv 2405.13985), and the
authors' code (GreenCUBIC/lookhere, ``create_lh_bias_tensor``; the same construction in
the ADE20K configs of an author's mmsegmentation fork, DanielKyr/mmsegmentation).

Bias of layer l, head h, query i, key j, added to the scaled logits q.k / sqrt(d):

    B_lh(i, j) = -g * s_l * m_h * ||r_j - r_i||   if r_j - r_i lies in head h's field of view,
               = -inf                             otherwise,

* ||.|| is the Euclidean distance in patch units (the release's default ``distance:
  linear``; its ``sqrt``/``square`` penalties are appendix ablations, not offered here);
* g is the global slope, 2 in all three released variants;
* s_l goes linearly from ``layer_slopes[0]`` = 1.5 in the first layer to
  ``layer_slopes[1]`` = 0.5 in the last (numpy ``linspace``; one layer gets the first);
* m_h is the head slope, per *group* of heads (see below): directed heads of a group get
  2^-(1 + j // 4) for the j-th head of the group (1/2 for the first cycle of four
  directions, 1/4 for a second cycle, ...); unmasked ("none") heads get ALiBi-like
  4^-(1 + j // ceil(n / 4)) for the j-th of n, i.e. 1/4, 1/16, 1/64, 1/256 for four.
  So in LH-90's first layer the directed heads decay with slope 2 * 1.5 * 1/2 = 1.5 per
  patch and the unmasked heads with 0.75, 0.1875, 0.047, 0.012.

Fields of view. Offsets d = r_j - r_i are grid (d_row, d_col); "up" is -row. A field of
view is the intersection of closed half-planes {d : n . d >= 0}, one per compass
direction n it looks towards (up = (-1, 0), up-right = (-1, 1), ...). Every boundary is
*inside*: keys on a boundary ray (same row/column for halves and corners, on a diagonal for
triangles and eighths) are seen, as in the release, whose masks are integer comparisons
of grid indices (x_j >= x_i, x_j - y_j >= x_i - y_i, ...). The query's own position,
d = 0, lies in every field of view, so every positioned query sees itself and no row of
a head is empty. The released head groups, four heads each in this order:

    halves     180 deg  up, down, left, right                  (one half-plane each)
    diagonals  180 deg  up-right, up-left, down-right, down-left (half-planes bounded by
                        a diagonal through the query)
    corners     90 deg  up-left, up-right, down-left, down-right quadrants
    triangles   90 deg  cones around up, down, left, right (bounded by both diagonals)
    eighths1    45 deg  tri-up & left, tri-down & left, tri-left & up, tri-right & up
    eighths2    45 deg  tri-up & right, tri-down & right, tri-left & down, tri-right & down
    none       360 deg  unmasked: plain 2D-ALiBi heads

(an "eighth" is the wedge between an axis and a diagonal; eighths1 and eighths2 together
tile the plane). The three variants of the paper, each 8 directed heads pointing in 8
directions plus 4 unmasked heads on a 12-head ViT-B, differ only in the field of view:

    lh180: halves-diagonals-none     lh90: corners-triangles-none     lh45: eighths1-eighths2-none

LH-90 is the configuration of the released ``LH_90_weights_and_config.pth`` and the one
PaPE ("Where to Attend: A Principled Vision-Centric Position Encoding with
Parabolas", arXiv 2602.01418) re-implemented for its Table 1
(DTU-PAS/parabolic-position-encoding, ``pape/nn/positions/lookhere.py``). That
re-implementation calls the release's builder once per layer with depth 1, so every
layer gets s_l = 1.5 rather than 1.5 ... 0.5; ``layer_slopes: [1.5, 1.5]`` reproduces it.
``variant: custom`` takes any sequence of distinct ``head_groups``.

Number of heads. The release handles 12 and 16 heads (and 6 heads for two-group configs
whose second group is "none"). pe-bench generalises its rule: heads are dealt in whole
cycles of four to the groups in turn, and a remainder of fewer than four goes to the next
group in turn, which takes its first heads; heads are then ordered group by group. This
reproduces the release at 12 heads (4, 4, 4), 16 heads (8, 4, 4) and 6 heads (4, 2), and
gives e.g. (8, 8, 8) at 24. With fewer than 12 heads the later groups go short or empty:
the tiny 4-head model's LH-90 is the four corner heads (quadrants, still covering every
direction), LH-180 the four halves, LH-45 only eighths1 (half the plane stays unseen).

Differences from the release. The release stores the bias in bfloat16 (distances rounded
to 8 significant bits) and masks with -finfo(bfloat16).max; pe-bench computes in the
dtype of its buffers (float32, or float64 after ``.double()``) and masks with -inf. The
release's CLS token gets a zero bias row and column (unbiased, never masked), as here.
(Under 16-bit autocast the attention core casts a dense bias to q's dtype, so there the
dense path rounds the distances to bf16 as the release does; the FlexAttention path adds
the bias in the score's dtype.)
pe-bench computes the masks from the layout's coordinates rather than grid indices, so
they also hold for interpolated (scaled) positions; tokens without a position (CLS) get
no bias and no mask (padding keys are masked by the attention core). No row is ever left
fully masked: a padding query's row, and the row of a positioned query that could see no
admissible key at all (cross-attention layouts without its own position), keeps the
distance bias but drops the direction mask, so padding rows stay finite and nothing NaN
reaches later layers. In self-attention a valid positioned query always sees itself, so
only padding rows are affected.

FlexAttention form (``score_mod``, used on CUDA): the same bias and fields of view,
computed per (head, query, key) from the (B, N, 2) coordinates and per-head slopes and
half-plane normals inside the kernel, with -inf outside the view; nothing N x N is
stored. The per-row drop flags above need no pass over the keys in self-attention; a
cross-attention layer computes them in one chunked pass (linear memory).

The bias depends on r_j - r_i only (translation invariance), decreases with distance
inside the field of view (distance decay) and depends on direction (directionality);
the masks break rotation invariance, and the bias rules out SDPA's fused kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import Field, NonNegativeFloat, model_validator
from torch import Tensor

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

#: Compass directions as (d_row, d_col) normals; "up" is -row on an image.
COMPASS: dict[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
    "up_left": (-1, -1),
    "up_right": (-1, 1),
    "down_left": (1, -1),
    "down_right": (1, 1),
}

_TRI_UP = ("up_left", "up_right")
_TRI_DOWN = ("down_left", "down_right")
_TRI_LEFT = ("up_left", "down_left")
_TRI_RIGHT = ("up_right", "down_right")

#: The release's head groups: per head, the compass directions whose closed half-planes
#: its field of view intersects (no directions: unmasked). Order as in the release.
HEAD_GROUPS: dict[str, tuple[tuple[str, ...], ...]] = {
    "halves": (("up",), ("down",), ("left",), ("right",)),
    "diagonals": (("up_right",), ("up_left",), ("down_right",), ("down_left",)),
    "corners": (("up", "left"), ("up", "right"), ("down", "left"), ("down", "right")),
    "triangles": (_TRI_UP, _TRI_DOWN, _TRI_LEFT, _TRI_RIGHT),
    "eighths1": (_TRI_UP + ("left",), _TRI_DOWN + ("left",), _TRI_LEFT + ("up",), _TRI_RIGHT + ("up",)),
    "eighths2": (_TRI_UP + ("right",), _TRI_DOWN + ("right",), _TRI_LEFT + ("down",), _TRI_RIGHT + ("down",)),
    "none": ((), (), (), ()),
}
HeadGroup = Literal["halves", "diagonals", "corners", "triangles", "eighths1", "eighths2", "none"]

VARIANTS: dict[str, tuple[str, ...]] = {
    "lh180": ("halves", "diagonals", "none"),
    "lh90": ("corners", "triangles", "none"),
    "lh45": ("eighths1", "eighths2", "none"),
}


class LookHereOptions(EncodingOptions):
    variant: Literal["lh90", "lh180", "lh45", "custom"] = "lh90"
    #: ``variant: custom`` only: the head groups, each a cycle of four directions.
    head_groups: tuple[HeadGroup, ...] | None = None
    global_slope: float = Field(2.0, ge=0.0)
    #: s_l of the first and the last layer; not negative: a negative slope would make that
    #: layer's logits grow with distance (every slope is >= 0 in the release)
    layer_slopes: tuple[NonNegativeFloat, NonNegativeFloat] = (1.5, 0.5)

    @model_validator(mode="after")
    def _groups_match_variant(self) -> LookHereOptions:
        if self.variant == "custom":
            if not self.head_groups:
                raise ValueError("lookhere: variant 'custom' needs head_groups, e.g. [corners, triangles, none]")
            if len(set(self.head_groups)) != len(self.head_groups):
                raise ValueError(
                    f"lookhere: head_groups {list(self.head_groups)} names a group twice; list it once "
                    "(a group takes further cycles of four heads as the head count grows)"
                )
        elif self.head_groups is not None:
            raise ValueError(
                f"lookhere: variant {self.variant!r} fixes the head groups {list(VARIANTS[self.variant])}; "
                "set variant: custom to choose head_groups"
            )
        return self

    def groups(self) -> tuple[str, ...]:
        return self.head_groups if self.variant == "custom" else VARIANTS[self.variant]


def heads_per_group(num_groups: int, num_heads: int) -> list[int]:
    """Heads each group receives: whole cycles of four dealt to the groups in turn, then
    the remainder (< 4) to the next group in turn (see the module docstring)."""
    counts = [0] * num_groups
    dealt, turn = 0, 0
    while dealt < num_heads:
        take = min(4, num_heads - dealt)
        counts[turn % num_groups] += take
        dealt += take
        turn += 1
    return counts


def head_slope(group: str, index: int, group_size: int) -> float:
    """m_h of the ``index``-th head of a group of ``group_size`` heads (release's get_slopes
    and get_none_slopes, extended to any group size)."""
    if group == "none":
        return 4.0 ** -(1 + index // math.ceil(group_size / 4))
    return 2.0 ** -(1 + index // 4)


def head_layout(groups: Sequence[str], num_heads: int) -> list[tuple[tuple[str, ...], float]]:
    """Per head, group by group: (compass directions of its field of view, head slope m_h)."""
    heads = []
    for group, size in zip(groups, heads_per_group(len(groups), num_heads), strict=True):
        for j in range(size):
            heads.append((HEAD_GROUPS[group][j % 4], head_slope(group, j, size)))
    return heads


class LookHereLayer(LayerEncoding):
    bias_by_query_chunks = True  # each pair's distance and direction

    def __init__(self, num_heads: int, options: LookHereOptions, layer_slope: float) -> None:
        super().__init__()
        heads = head_layout(options.groups(), num_heads)
        width = max(1, max(len(directions) for directions, _ in heads))
        # (H, K, 2) half-plane normals; zero rows pad heads with fewer than K constraints
        # (0 . d >= 0 always holds), so an unmasked head has only zero rows.
        normals = torch.zeros(num_heads, width, 2)
        for h, (directions, _) in enumerate(heads):
            for k, name in enumerate(directions):
                normals[h, k] = torch.tensor(COMPASS[name], dtype=normals.dtype)
        slopes = torch.tensor([options.global_slope * layer_slope * m for _, m in heads], dtype=torch.float64)
        # (H, K, 3): per head and constraint, the normal's row and column components and its
        # length. One tensor the score_mod indexes, not K views of one: Inductor's CPU
        # FlexAttention template rejects closed-over tensors that alias each other.
        half_planes = torch.cat([normals, normals.norm(dim=-1, keepdim=True)], dim=-1)
        self.register_buffer("half_planes", half_planes, persistent=False)
        self.register_buffer("slopes", slopes.float(), persistent=False)
        self.fields_of_view = [directions for directions, _ in heads]

    def visibility(self, delta: Tensor, dist: Tensor) -> Tensor:
        """(B, Nq, Nk, 2) offsets r_j - r_i -> (B, H, Nq, Nk) True where j is in head h's view."""
        planes = self.half_planes[None, :, None, None]  # (1, H, 1, 1, K, 3)
        d_row, d_col, dist = delta[..., 0].unsqueeze(1), delta[..., 1].unsqueeze(1), dist.unsqueeze(1)
        visible = None
        for k in range(self.half_planes.shape[1]):
            inside = _in_half_plane(d_row, d_col, dist, planes[..., k, 0], planes[..., k, 1], planes[..., k, 2])
            visible = inside if visible is None else visible & inside
        return visible

    def _coords(self, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """Query and key positions in the buffers' dtype: float64 after model.double(), float32 otherwise."""
        cq = inputs.query.coords.to(self.slopes.dtype)
        return cq, cq if inputs.key is inputs.query else inputs.key.coords.to(self.slopes.dtype)

    def unmasked_rows(self, inputs: AttentionInputs, visible: Tensor | None = None) -> Tensor | None:
        """(B, H or 1, Nq) True for query rows whose direction mask is dropped (module doc):
        padding queries, and positioned queries that would see no admissible key. None: none.

        ``visible``: the dense (B, H, Nq, Nk) field of view, if already built. Without it, a
        self-attention layer needs no pass over the keys (a valid positioned query sees
        itself: d = 0 lies in every view, and causality keeps j = i), and cross-attention
        makes one pass in chunks of queries, so memory stays linear in the keys.
        """
        padding = None if inputs.query.valid is None else ~inputs.query.valid[:, None, :]
        if visible is not None:
            blind = ~self._sees_a_key(visible, inputs, 0)
        elif inputs.key is inputs.query:
            return padding
        else:
            blind = self._blind_rows(inputs)
        return blind if padding is None else blind | padding

    def _blind_rows(self, inputs: AttentionInputs) -> Tensor:
        """(B, H, Nq) True where a query sees no admissible key, without any N x N tensor."""
        cq, ck = self._coords(inputs)
        n_k = ck.shape[1]
        rows = max(1, _CHUNK_ELEMENTS // (cq.shape[0] * self.slopes.shape[0] * n_k))
        blind = []
        for start in range(0, cq.shape[1], rows):
            delta = ck.unsqueeze(1) - cq[:, start : start + rows].unsqueeze(2)
            visible = self.visibility(delta, _distance(delta[..., 0], delta[..., 1]))
            blind.append(~self._sees_a_key(visible, inputs, start))
        return torch.cat(blind, dim=-1)

    @staticmethod
    def _sees_a_key(visible: Tensor, inputs: AttentionInputs, start: int) -> Tensor:
        """(B, H, R) True where query rows start..start+R see a key they may attend to: valid,
        not causally hidden, and in view or position-free (CLS is always in view)."""
        key = inputs.key
        n_rows, n_k, n_q = visible.shape[-2], visible.shape[-1], inputs.query.coords.shape[1]
        admissible = visible | ~key.has_pos[:, None, None, :]
        if key.valid is not None:
            admissible &= key.valid[:, None, None, :]
        if inputs.causal:
            i = torch.arange(start, start + n_rows, device=visible.device)[:, None]
            admissible &= torch.arange(n_k, device=visible.device) <= i + (n_k - n_q)
        return admissible.any(-1)

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        # Distances and fields of view are the same in every layer (only the slopes change):
        # computed once per forward.
        view = (self.slopes.dtype, tuple(self.fields_of_view))
        pair_dist, masked = shared_per_forward(inputs, ("lookhere-view", view), lambda: self._view(inputs))
        # 0 outside positioned pairs comes from the shared distances (-slope * 0: a -0.0 there,
        # which adds to a score as +0.0 does), so a layer makes two passes, not four
        return (-self.slopes[:, None, None] * pair_dist).masked_fill(masked, float("-inf"))

    def _view(self, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """(B, 1, Nq, Nk) distances of positioned pairs (0 elsewhere) and (B, H, Nq, Nk)
        masked pairs, cut to one sample when every sample shares them."""
        inputs = first_sample_if_shared(inputs)  # a grid's bias is built once, not per sample
        query, key = inputs.query, inputs.key
        cq, ck = self._coords(inputs)
        delta = ck.unsqueeze(1) - cq.unsqueeze(2)  # (B, Nq, Nk, 2): r_j - r_i
        dist = _distance(delta[..., 0], delta[..., 1])
        visible = self.visibility(delta, dist)
        pair = query.has_pos[:, None, :, None] & key.has_pos[:, None, None, :]
        masked = pair & ~visible & ~self.unmasked_rows(inputs, visible).unsqueeze(-1)
        return torch.where(pair, dist.unsqueeze(1), 0.0), masked

    def score_mod(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> ScoreMod:
        # The fields of view go into the score_mod as -inf rather than into a mask_mod:
        # they differ per head, and ``make_block_mask`` builds one mask for all heads; a
        # per-head block mask would be evaluated for every (head, query, key) in every layer
        # to skip only the blocks that lie wholly outside a view, which in row-major token
        # order happens only for views that exclude all rows above or below the query (about
        # half the blocks of 6 of LH-90's 12 heads, none of the rest). -inf in the scores is
        # the same softmax, and the drop rule (module doc) leaves no row without a key, so
        # no row is fully masked and nothing relies on the kernel's empty-row handling.
        cq, ck = self._coords(inputs)
        has_q, has_k = inputs.query.has_pos, inputs.key.has_pos
        slopes, planes = self.slopes, self.half_planes
        unmasked = self.unmasked_rows(inputs)
        if unmasked is not None:  # (B, H, Nq), its own storage (see __init__ on aliasing)
            unmasked = unmasked.expand(-1, slopes.shape[0], -1).contiguous()

        def lookhere(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            d_row, d_col = ck[b, j, 0] - cq[b, i, 0], ck[b, j, 1] - cq[b, i, 1]
            dist = _distance(d_row, d_col)
            visible = None
            for c in range(planes.shape[1]):
                inside = _in_half_plane(d_row, d_col, dist, planes[h, c, 0], planes[h, c, 1], planes[h, c, 2])
                visible = inside if visible is None else visible & inside
            pair = has_q[b, i] & has_k[b, j]
            bias = torch.where(pair, -slopes[h] * dist, 0.0)
            masked = pair & ~visible
            if unmasked is not None:
                masked = masked & ~unmasked[b, h, i]
            return score + torch.where(masked, float("-inf"), bias).to(score.dtype)

        return lookhere


def _distance(d_row: Tensor, d_col: Tensor) -> Tensor:
    """Euclidean length of offsets, one expression for the dense bias and the score_mod."""
    return (d_row.square() + d_col.square()).sqrt()


#: Elements of one chunk of a cross-attention's (B, H, rows, Nk) field of view.
_CHUNK_ELEMENTS = 1 << 24


def _in_half_plane(
    d_row: Tensor, d_col: Tensor, dist: Tensor, normal_row: Tensor, normal_col: Tensor, normal_norm: Tensor
) -> Tensor:
    """n . d >= 0 for offsets d and normals n (broadcast), shared by the dense bias and the
    score_mod so that both decide every boundary key alike. The normals are integer vectors,
    so on integer grids n . d is exact and the boundary rays are exactly inside; the small
    relative slack keeps boundary keys inside when positions were scaled (interpolation)
    and round-off breaks the tie. A zero normal (padding constraint) always holds."""
    slack = 64 * torch.finfo(dist.dtype).eps * dist
    return normal_row * d_row + normal_col * d_col >= -slack * normal_norm


@register("lookhere")
class LookHere(PositionEncoding):
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.DISTANCE_DECAY, Principle.DIRECTIONALITY})
    requires_grid = True
    pos_dims = frozenset({2})
    Options = LookHereOptions

    def layer_slope(self, layer_index: int) -> float:
        first, last = self.options.layer_slopes
        if self.depth <= 1:
            return first
        return first + (last - first) * layer_index / (self.depth - 1)

    def claimed_principles(self) -> frozenset[Principle]:
        claims = set(self.principles)
        opts = self.options
        if opts.global_slope == 0 or 0 in opts.layer_slopes:
            # A zero slope somewhere leaves that layer's heads with masks but no decay.
            claims.discard(Principle.DISTANCE_DECAY)
        if all(not directions for directions, _ in head_layout(opts.groups(), self.num_heads)):
            claims.discard(Principle.DIRECTIONALITY)  # only unmasked heads: plain 2D-ALiBi
        return frozenset(claims)

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return LookHereLayer(self.num_heads, self.options, self.layer_slope(layer_index))
