"""PaPE-RI: the rotation-invariant instantiation of PaPE (Øhrstrøm et al., "Where to Attend:
A Principled Vision-Centric Position Encoding with Parabolas", arXiv 2602.01418, Section 4
and Appendix A.1).

PaPE's Eq. 9 under the constraints b_i = 0, a_il = α_i < 0 for all l, W_p = w_p I_P:

    S_ij = <q_i, k_j> + α_i w_p^2 ||r_j - r_i||^2,     α_i = -softplus(w_α · x_i),

per layer and head: w_α is a D-vector (one Linear(D, H) per layer), w_p one scalar.
The bias depends on r_j - r_i only through its norm, so it is translation and rotation
invariant (Appendix A.1); α_i < 0 gives distance decay, α_i's dependence on x_i context
awareness. Without b there is no directionality.

Two forms, selected by ``form``:

* ``efficient`` (default): with s = w_p r (P channels), the paper's Eq. 13-14 constrained
  to PaPE-RI, where α_i is one scalar, so the m = P copies of α collapse:
      f_q = q_i ⊕ α_i|s_i|^2 ⊕ α_i ⊕ (-2 α_i s_i)
      f_k = k_j ⊕ 1         ⊕ |s_j|^2 ⊕ s_j
  <f_q, f_k> = <q_i, k_j> + α_i (|s_i|^2 + |s_j|^2 - 2 s_i·s_j) = <q_i, k_j> + α_i |s_j - s_i|^2.
  That is h + P + 2 channels instead of the official code's h + 2P + 1 (it repeats α_i
  over the P channels that meet |s_j|^2's components). The widened head is zero-padded to
  ``pad_to``. As in pe-bench's PaPE, positions are first expressed relative to the mean
  key position, which is exact (translation invariance) and keeps |s|^2 small for
  low-precision arithmetic; the official code uses the raw positions.
  With 16-bit q/k the same cancellation α_i(|s_i|^2 + |s_j|^2 - 2 s_i·s_j) would happen in
  bf16; ``low_precision`` "split" (default) carries the extra features as hi + lo 16-bit
  pairs so that it happens in the kernel's float32 accumulator, as pape.py's ``widen_heads``;
  ``frame_tile`` gives each tile of queries its own frame, for exact gradients in 16 bits
  too (pape.py's "Frames"); "bias" forms the features' product as a float32 N x N bias
  and leaves q/k unwidened, exact forward and gradients in 16 bits (pape.py's "Positional
  bias").
* ``explicit``: α_i w_p^2 ||r_j - r_i||^2 built directly as a (B, H, Nq, Nk) bias from the
  pairwise distances (independently of the factorisation above): the test oracle. Its
  FlexAttention form (``score_mod``, used on CUDA for large biases) evaluates the same
  expression per (query, key) pair inside the kernel from α (B, H, Nq), w_p^2 (H) and the
  P coordinates of each side: memory linear in the tokens. The positional bias form has
  none: its float32 product of features is the point of it, and a score_mod would compute
  the pair's distance directly, which is the explicit form.

Initialisation of w_p, selected by ``wp_init`` (the paper states none):

* ``official`` (default), as the authors' code (DTU-PAS/parabolic-position-encoding,
  ``pape/nn/positions/pape_ri.py``): per layer and head w_p ~ U(-1/sqrt(P), 1/sqrt(P)),
  drawn from torch's global generator when the layer is built (so the run's seed fixes
  it) and registered as a buffer: w_p is *not trained*, and it is saved in checkpoints.
  Only w_p^2 enters, so a head's decay rate w_p^2 is U(0, 1/P)-like, and a head whose
  draw lands near 0 barely decays.
* ``geometric``: pe-bench's earlier choice, a learnable w_p = 2^(-4h/H), h = 1..H, so
  w_p^2 runs over ALiBi's head slopes 2^(-8h/H): every head decays from step 0 and heads
  span local to global scales like nD-ALiBi, PaPE-RI's closest relative (Appendix D).

w_α starts as nn.Linear's default in both (as in the official code), so α_i ≈ -log 2 at first.

Position-free tokens. pe-bench keeps CLS (and other prefix tokens) position-free: α of a
CLS query is zeroed and a CLS key contributes no positional channel, so the CLS row and
column carry no bias. The official ImageNet classifier instead gives CLS the position
(0, 0) next to patches at (1..W, 1..H), so there the CLS query decays with its keys'
distance to that corner and patches see the CLS key as a token at (0, 0).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from .base import (
    AttentionInputs,
    LayerEncoding,
    PositionEncoding,
    Principle,
    ScoreMod,
    shared_by_query_chunks,
)
from .pape import (
    WidenedFormOptions,
    frame_coords,
    frame_dtype,
    frame_tiles,
    pape_bias_elements,
    positional_bias,
    positioned_keys,
    widen_heads,
)
from .registry import register


class PaPERIOptions(WidenedFormOptions):
    form: Literal["efficient", "explicit"] = "efficient"
    pad_to: int = Field(8, ge=1)
    #: official: frozen w_p ~ U(±1/sqrt(P)) (the authors' code); geometric: learnable 2^(-4h/H).
    wp_init: Literal["official", "geometric"] = "official"
    #: widened features with 16-bit q/k: "split" (hi + lo, float32-accurate), "round" or
    #: "bias" (a float32 N x N bias), as pape.py's.
    low_precision: Literal["split", "round", "bias"] = "split"
    #: efficient form: a frame per tile of frame_tile cells per grid axis (pape.py's "Frames").
    frame_tile: int | None = Field(None, ge=1)


class ParabolicRILayer(LayerEncoding):
    bias_by_query_chunks = True  # a query's alpha_i and position against every key, in the keys' frame

    def __init__(self, dim: int, num_heads: int, pos_dim: int, options: PaPERIOptions) -> None:
        super().__init__()
        self.options = options
        self.num_heads = num_heads
        self.w_alpha = nn.Linear(dim, num_heads, bias=False)
        if options.wp_init == "official":
            bound = 1.0 / math.sqrt(pos_dim)
            # A persistent buffer: frozen, but a checkpoint keeps the random draw.
            self.register_buffer("w_p", torch.empty(num_heads).uniform_(-bound, bound))
        else:
            heads = torch.arange(1, num_heads + 1, dtype=torch.float32)
            self.w_p = nn.Parameter(2.0 ** (-4.0 * heads / num_heads))

    def alpha(self, inputs: AttentionInputs) -> Tensor:
        """α_i = -softplus(w_α x_i), zero for queries without a position: (B, H, Nq, 1)."""
        alpha = -F.softplus(self.w_alpha(inputs.x_q)).transpose(1, 2).unsqueeze(-1)
        return alpha * inputs.query.has_pos[:, None, :, None]

    def _positions(self, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """Centred query/key positions, zeroed where a token has no position (``frame_coords``,
        by ``where``: stray values of CLS rows stay out entirely): (B or 1, N, P) each."""
        # In PaPE's frame dtype; centred on the keys, or with frame_tile on this tile's
        # queries (pape.py's "Frames").
        return frame_coords(self.options, inputs, frame_dtype(inputs))

    def query_groups(self, inputs: AttentionInputs) -> list[Tensor] | None:
        return frame_tiles(self.options, inputs)

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        if self.options.form == "explicit" or self.options.positional_bias_form(q):
            return q, k
        split = self.options.low_precision == "split"
        return widen_heads(q, k, *self._extra_features(inputs), split, self.options.pad_to)

    def _extra_features(self, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """The efficient form's positional features f_q (B, H, Nq, P + 2) and f_k (B or 1, H,
        Nk, P + 2), float32 at least, zero for tokens without a position."""
        r_q, r_k = self._positions(inputs)
        s_q = self._scaled(r_q)  # (B, H, Nq, P)
        # α (16-bit under autocast) joins the frame's dtype first, so that its gradient's
        # terms add up there and not in 16 bits (pape.py's _extra_features).
        alpha = self.alpha(inputs).to(s_q.dtype)
        norm_q = s_q.square().sum(-1, keepdim=True)
        q_extra = torch.cat([alpha * norm_q, alpha, -2 * alpha * s_q], dim=-1)
        if r_k is r_q:  # self-attention: the keys' features are the queries'
            return q_extra, self._key_features(s_q, norm_q, inputs)
        # once per attention call when its queries come in chunks (pape.py's _extra_features)
        k_extra = shared_by_query_chunks(
            inputs, ("pape-ri-key-features", r_k.dtype), lambda: self._key_features(self._scaled(r_k), None, inputs)
        )
        return q_extra, k_extra

    def _scaled(self, r: Tensor) -> Tensor:
        """s = w_p r per head: (B, N, P) -> (B, H, N, P)."""
        return self.w_p[None, :, None, None] * r.unsqueeze(1)

    def _key_features(self, s_k: Tensor, norm: Tensor | None, inputs: AttentionInputs) -> Tensor:
        """f_k = 1 ⊕ |s_k|^2 ⊕ s_k, zero for keys without a position; ``norm``: |s_k|^2 when
        already computed."""
        norm = s_k.square().sum(-1, keepdim=True) if norm is None else norm
        return positioned_keys(torch.cat([torch.ones_like(s_k[..., :1]), norm, s_k], dim=-1), inputs)

    def dense_bias_elements(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> int:
        return pape_bias_elements(self.options, q, k, per_pair=1)

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor | None:
        if self.options.positional_bias_form(q):
            return positional_bias(*self._extra_features(inputs), q, inputs)
        if self.options.form != "explicit":
            return None
        r_q, r_k = self._positions(inputs)
        dist2 = (r_k.unsqueeze(1) - r_q.unsqueeze(2)).square().sum(-1)  # (B, Nq, Nk)
        out = self.alpha(inputs) * self.w_p.square()[None, :, None, None] * dist2.unsqueeze(1)
        # Like PaPE's Eq. 9, the bias lives inside S, which attention scales by 1/sqrt(h).
        return out * inputs.key.has_pos[:, None, None, :] / math.sqrt(q.shape[-1])

    def score_mod(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> ScoreMod | None:
        if self.options.form != "explicit":
            return None  # the efficient form has no bias, the positional bias form no Flex form
        # positions shared by the batch (one sample, first_sample_if_shared) indexed per sample
        r_q, r_k = (r.expand(q.shape[0], -1, -1) for r in self._positions(inputs))
        # α and w_p^2 each read once per pair (Inductor's Flex backward takes a tensor that
        # requires gradients indexed once only: _flex.indexed_once)
        alpha = self.alpha(inputs).squeeze(-1)  # (B, H, Nq), zero for queries without a position
        weight = self.w_p.square() / math.sqrt(q.shape[-1])  # Eq. 9's bias sits inside S: 1/sqrt(h)
        has_k, axes = inputs.key.has_pos, r_q.shape[-1]

        def parabola(score: Tensor, n: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            dist2 = sum((r_k[n, j, p] - r_q[n, i, p]).square() for p in range(axes))
            return score + torch.where(has_k[n, j], alpha[n, h, i] * weight[h] * dist2, 0.0).to(score.dtype)

        return parabola


@register("pape-ri")
class ParabolicRIEncoding(PositionEncoding):
    principles = frozenset(
        {
            Principle.TRANSLATION_INVARIANCE,
            Principle.ROTATION_INVARIANCE,
            Principle.DISTANCE_DECAY,
            Principle.CONTEXT_AWARENESS,
            Principle.FUSED_KERNEL,
        }
    )
    Options = PaPERIOptions

    def claimed_principles(self) -> frozenset[Principle]:
        if self.options.form == "explicit" or self.options.low_precision == "bias":  # N x N bias (pape.py)
            return self.principles - {Principle.FUSED_KERNEL}
        return self.principles

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return ParabolicRILayer(self.dim, self.num_heads, self.geometry.pos_dim, self.options)
