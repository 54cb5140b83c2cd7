"""nD-ALiBi: the 2D-ALiBi of Fuller et al. ("CROMA: Remote Sensing Representations with
Contrastive Radar-Optical Masked Autoencoders", arXiv 2311.00566), extended to any P as in
PaPE ("Where to Attend: A Principled Vision-Centric Position Encoding with Parabolas",
arXiv 2602.01418) Section 5.1.

Bias on the scaled logits:  bias_hij = -slope_h * ||r_j - r_i||_2,  fixed (no parameters).

Head slopes are ALiBi's (Press et al., "Train Short, Test Long: Attention with Linear Biases
Enables Input Length Extrapolation", arXiv 2108.12409, their reference ``get_slopes``):
for a power of two H, slope_h = 2^(-8h/H), h = 1..H; otherwise, with n = 2^floor(log2 H),
the n slopes of that formula followed by the slopes h = 1, 3, 5, ... of the 2n-head
ladder, up to H.
For H = 12 (ViT-B) that is 2^-1, ..., 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.

Euclidean distance makes the bias translation and rotation invariant; positive slopes make
it decay with distance. Padding keys are masked by the attention core; their coordinates
are ignored here.

CLS: rows and columns of tokens without a position get zero bias, so the CLS attends and
is attended without any distance penalty. The official PaPE code's nD-ALiBi
(DTU-PAS/parabolic-position-encoding) instead places the CLS at (0, 0), next to patches
at (1..W, 1..H), inside the bias: the CLS is penalised by its distance to that corner.

FlexAttention form (``score_mod``): the same distance computed per (query, key) pair
from the (B, N, P) coordinates inside the kernel; memory stays linear in the tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import (
    AttentionInputs,
    LayerEncoding,
    PositionEncoding,
    PositionLayout,
    Principle,
    ScoreMod,
    first_sample_if_shared,
    shared_per_forward,
)
from .registry import register


def alibi_slopes(num_heads: int) -> Tensor:
    """Press et al.'s head slopes (see module doc), largest first: (H,)."""

    def ladder(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    power = 2 ** math.floor(math.log2(num_heads))
    slopes = ladder(power) + ladder(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=torch.float32)


def positioned_coords(layout: PositionLayout) -> Tensor:
    """Coordinates (at least float32) with rows of position-free or padding tokens set to 0."""
    coords = layout.coords.to(torch.promote_types(layout.coords.dtype, torch.float32))
    return torch.where(layout.positioned.unsqueeze(-1), coords, 0.0)


def pair_mask(inputs: AttentionInputs) -> Tensor:
    """(B, 1, Nq, Nk) True where both query and key carry a position."""
    return (inputs.query.has_pos[:, :, None] & inputs.key.has_pos[:, None, :]).unsqueeze(1)


def query_key_coords(inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
    """``positioned_coords`` of the query and the key layout (one tensor for self-attention)."""
    r_q = positioned_coords(inputs.query)
    return r_q, r_q if inputs.key is inputs.query else positioned_coords(inputs.key)


def pairwise_score_mod(inputs: AttentionInputs, bias_of_offset) -> ScoreMod:
    """A score_mod adding ``bias_of_offset(h, offsets)`` for pairs of positioned tokens, with
    ``offsets`` the P scalars r_j - r_i (per axis, so P loads instead of a vector gather)."""
    r_q, r_k = query_key_coords(inputs)
    has_q, has_k = inputs.query.has_pos, inputs.key.has_pos

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        offsets = [r_k[b, j, p] - r_q[b, i, p] for p in range(r_q.shape[-1])]
        bias = torch.where(has_q[b, i] & has_k[b, j], bias_of_offset(h, offsets), 0.0)
        return score + bias.to(score.dtype)

    return score_mod


class ALiBiLayer(LayerEncoding):
    bias_by_query_chunks = True  # a function of each pair's positions

    def __init__(self, slopes: Tensor) -> None:
        super().__init__()
        self.register_buffer("slopes", slopes, persistent=False)

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        # Every layer shares this module (fixed slopes), so one bias serves the whole forward.
        return shared_per_forward(inputs, ("alibi-bias", self), lambda: self._bias(inputs))

    def _bias(self, inputs: AttentionInputs) -> Tensor:
        inputs = first_sample_if_shared(inputs)  # a grid's bias is built once, not per sample
        r_q, r_k = query_key_coords(inputs)
        # Direct differences, not the |a|^2 + |b|^2 - 2ab expansion: exact translation invariance.
        dist = torch.cdist(r_q, r_k, compute_mode="donot_use_mm_for_euclid_dist")  # (B, Nq, Nk)
        bias = -self.slopes[None, :, None, None] * dist.unsqueeze(1)
        return bias * pair_mask(inputs)

    def score_mod(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> ScoreMod:
        slopes = self.slopes

        def alibi(h: Tensor, offsets: list[Tensor]) -> Tensor:
            return -slopes[h] * sum(d.square() for d in offsets).sqrt()

        return pairwise_score_mod(inputs, alibi)


@register("alibi")
class NDALiBi(PositionEncoding):
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.ROTATION_INVARIANCE, Principle.DISTANCE_DECAY})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._layer = ALiBiLayer(alibi_slopes(self.num_heads))

    def make_layer(self, layer_index: int) -> LayerEncoding:
        # Fixed slopes and no parameters: every layer can share one module.
        return self._layer
