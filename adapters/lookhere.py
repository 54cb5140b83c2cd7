"""LookHere (Fuller et al., NeurIPS 2024): 2D-ALiBi with directed fields of view per head.

Per layer l and head h the bias on the scaled logits is

    B_h(i, j) = -g * s_l * m_h * ||r_j - r_i||     if r_j lies in head h's field of view from r_i,
              = -inf                                otherwise,

* the field of view of head h is the cone of half-angle ``fov_degrees / 2`` around the
  direction u_h; its boundary rays are inside (so LookHere-90's triangles keep their
  diagonals, LookHere-180's halves keep the perpendicular line). r_j = r_i is always
  inside, so a query always sees itself and no row is empty;
* directions are ``num_directions`` equally spaced angles, cycled over the heads; the
  default offset puts every cone boundary on a multiple of 45 deg, where grid cells lie
  exactly, so the masks have no ties decided by rounding (LookHere's halves, triangles
  and eighths are the 180, 90 and 45 degree cases);
* m_h = ratio^(1 + h // num_directions): one slope per cycle of directions, halving
  from cycle to cycle as the reference's per-head slopes 2^-1, 2^-2, ...;
* s_l goes linearly from ``layer_slopes[0]`` in the first layer to ``layer_slopes[1]``
  in the last (decaying across depth), g is the global slope.

Coordinates are grid (row, col): "right" is +col, "up" is -row, angles count counter-
clockwise from right as seen on the image. Tokens without a position (CLS) and padding
rows/columns get no bias and no mask: CLS is unbiased and unmasked, and a padding query
row stays finite so nothing NaN can reach the values of later layers. If a positioned
query could see no admissible key at all (cross-attention layouts without its own
position, causal masking), its row keeps the distance bias but drops the direction mask.

The bias depends on r_j - r_i only (translation invariance), decreases with distance
inside the field of view (distance decay) and depends on direction (directionality);
the masks break rotation invariance, and the N x N bias rules out the fused kernel.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from .base import AttentionInputs, EncodingOptions, LayerEncoding, PositionEncoding, Principle
from .registry import register


class LookHereOptions(EncodingOptions):
    fov_degrees: float = Field(90.0, gt=0.0, le=360.0)
    #: None: 360 / fov_degrees rounded, at least 4 (LookHere-180 uses 4 overlapping halves).
    num_directions: int | None = Field(None, ge=1)
    #: None: (fov / 2) mod 45, so that cone boundaries fall on multiples of 45 degrees.
    direction_offset_degrees: float | None = None
    global_slope: float = Field(1.0, ge=0.0)
    layer_slopes: tuple[float, float] = (1.5, 0.5)
    head_slope_ratio: float = Field(0.5, gt=0.0)


def direction_order(count: int) -> list[int]:
    """Order in which directions are handed to heads.

    For a power of two this is the bit-reversal (van der Corput) order, 0, 4, 2, 6, ... for
    8: any prefix of heads then looks in directions spread around the circle, so a model
    with fewer heads than directions is not blind to one half of the image.
    """
    if count & (count - 1):
        return list(range(count))
    bits = max(count.bit_length() - 1, 0)
    return [int(f"{k:0{bits}b}"[::-1], 2) if bits else 0 for k in range(count)]


class LookHereLayer(LayerEncoding):
    def __init__(self, num_heads: int, options: LookHereOptions, layer_slope: float) -> None:
        super().__init__()
        fov = options.fov_degrees
        count = options.num_directions or max(4, round(360.0 / fov))
        offset = options.direction_offset_degrees
        if offset is None:
            offset = (fov / 2.0) % 45.0
        order = direction_order(count)
        angles = torch.tensor(
            [math.radians(offset + 360.0 * order[h % count] / count) for h in range(num_heads)], dtype=torch.float64
        )
        # (d_row, d_col) of each head's direction: "up" is -row on an image.
        directions = torch.stack([-torch.sin(angles), torch.cos(angles)], dim=-1)
        head_slopes = torch.tensor(
            [options.head_slope_ratio ** (1 + h // count) for h in range(num_heads)], dtype=torch.float64
        )
        self.register_buffer("directions", directions.float(), persistent=False)
        self.register_buffer("slopes", (options.global_slope * layer_slope * head_slopes).float(), persistent=False)
        self.cos_half_fov = math.cos(math.radians(fov / 2.0))
        self.direction_angles_degrees = [math.degrees(a) % 360.0 for a in angles.tolist()]

    def visibility(self, delta: Tensor, dist: Tensor) -> Tensor:
        """(B, Nq, Nk, 2) offsets r_j - r_i -> (B, H, Nq, Nk) True where j is in head h's view."""
        along = torch.einsum("bqkp,hp->bhqk", delta, self.directions)
        # Boundary rays lie on multiples of 45 degrees, where float round-off can put a
        # grid cell a hair outside: a relative tolerance keeps boundaries inside the view.
        return along >= (self.cos_half_fov - 1e-5) * dist.unsqueeze(1)

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        query, key = inputs.query, inputs.key
        cq = query.coords.float()
        ck = cq if key is query else key.coords.float()
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
        if opts.fov_degrees >= 360:
            claims.discard(Principle.DIRECTIONALITY)
        return frozenset(claims)

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return LookHereLayer(self.num_heads, self.options, self.layer_slope(layer_index))
