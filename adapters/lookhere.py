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
pe-bench computes the masks from the layout's coordinates rather than grid indices, so
they also hold for interpolated (scaled) positions; tokens without a position (CLS) and
padding get no bias and no mask, and a padding query row stays finite so nothing NaN can
reach later layers. If a positioned query could see no admissible key at all (cross-
attention layouts without its own position, causal masking), its row keeps the distance
bias but drops the direction mask.

The bias depends on r_j - r_i only (translation invariance), decreases with distance
inside the field of view (distance decay) and depends on direction (directionality);
the masks break rotation invariance, and the N x N bias rules out the fused kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from .base import AttentionInputs, EncodingOptions, LayerEncoding, PositionEncoding, Principle
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
    layer_slopes: tuple[float, float] = (1.5, 0.5)

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
        self.register_buffer("normals", normals, persistent=False)
        self.register_buffer("slopes", slopes.float(), persistent=False)
        self.fields_of_view = [directions for directions, _ in heads]

    def visibility(self, delta: Tensor, dist: Tensor) -> Tensor:
        """(B, Nq, Nk, 2) offsets r_j - r_i -> (B, H, Nq, Nk) True where j is in head h's view."""
        # The normals are integer vectors, so on integer grids n . d is exact and the
        # boundary rays are exactly inside; the small relative slack keeps boundary keys
        # inside when positions were scaled (interpolation) and round-off breaks the tie.
        slack = 64 * torch.finfo(delta.dtype).eps * dist.unsqueeze(1)
        visible = None
        for k in range(self.normals.shape[1]):
            normal = self.normals[:, k]  # (H, 2)
            along = torch.einsum("bqkp,hp->bhqk", delta, normal)
            inside = along >= -slack * normal.norm(dim=-1)[None, :, None, None]
            visible = inside if visible is None else visible & inside
        return visible

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        query, key = inputs.query, inputs.key
        # Positions in the buffers' dtype: float64 after model.double(), float32 otherwise.
        cq = query.coords.to(self.slopes.dtype)
        ck = cq if key is query else key.coords.to(self.slopes.dtype)
        delta = ck.unsqueeze(1) - cq.unsqueeze(2)  # (B, Nq, Nk, 2): r_j - r_i
        dist = delta.norm(dim=-1)
        visible = self.visibility(delta, dist)
        distance_bias = -self.slopes[:, None, None] * dist.unsqueeze(1)

        # Which keys a query could attend to at all: valid, and not causally hidden.
        n_q, n_k = cq.shape[1], ck.shape[1]
        admissible = torch.ones(ck.shape[0], 1, 1, n_k, dtype=torch.bool, device=ck.device)
        if key.valid is not None:
            admissible = admissible & key.valid[:, None, None, :]
        if inputs.causal:
            admissible = admissible & torch.ones(n_q, n_k, dtype=torch.bool, device=ck.device).tril(n_k - n_q)
        key_free = ~key.has_pos[:, None, None, :]  # CLS: always in view
        sees_something = ((visible | key_free) & admissible).any(-1, keepdim=True)

        pair = query.has_pos[:, None, :, None] & key.has_pos[:, None, None, :]
        masked = pair & ~visible & sees_something
        out = torch.where(pair, distance_bias, torch.zeros_like(distance_bias))
        return out.masked_fill(masked, float("-inf"))


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
