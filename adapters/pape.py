"""PaPE: Parabolic Position Encoding (Øhrstrøm et al., "Where to Attend: A Principled
Vision-Centric Position Encoding with Parabolas", arXiv 2602.01418, Section 4).

Logits (Eq. 9):  S_ij = <a_i, Δr_ij^2> + <b_i, Δr_ij> + <q_i, k_j>,  Δr_ij = W_p (r_j - r_i)
with a_i = -softplus(W_a x_i) (Eq. 7) and b_i = W_b x_i (Eq. 8), per layer and head.

Two forms, selected by ``form``:

* ``efficient`` (default): separate q/k features so the fused SDPA kernel computes Eq. 9
  without any N x N tensor. We use a narrower factorisation than the paper's Eq. 13-14
  (h + 2m + 1 instead of h + 3m + 2 channels) by merging the two terms that meet s_j:
  -2<a_i * s_i, s_j> + <b_i, s_j> = <b_i - 2 a_i * s_i, s_j>, and the two "1" columns:
      f_q = q_i ⊕ (<a_i, s_i^2> - <b_i, s_i>) ⊕ a_i ⊕ (b_i - 2 a_i ⊙ s_i)
      f_k = k_j ⊕ 1 ⊕ s_j^2 ⊕ s_j,                      s = W_p r.
  The widened head is zero-padded to a multiple of ``pad_to`` (fused kernels prefer it).
  Positions are first expressed relative to the mean key position: translation
  invariance makes this exact, and it keeps s small, so the cancellation in
  s_i^2 + s_j^2 - 2 s_i s_j loses less precision in bf16.

  16-bit numerics (``low_precision``): s = W_p r and every widened feature are computed
  in float32 (outside autocast), but SDPA needs q and k in one dtype. Rounding the
  widened features to bf16 (``"round"``) leaves a relative error of 2^-9 on terms of size
  |a| s^2 that cancel down to a |Δs|^2: errors of several logits among the nearest keys
  at 64 x 64 grids. ``"split"`` (default) carries each feature f as two 16-bit numbers
  f_hi = 16bit(f), f_lo = 16bit(f - f_hi) and widens the head by
  [f_q_hi, f_q_hi, f_q_lo] . [f_k_hi, f_k_lo, f_k_hi]: the kernel's products of 16-bit
  numbers are exact and accumulate in float32, so only the lo x lo term (2^-18 relative)
  is lost and the cancellation happens in float32. It triples the positional channels,
  and only applies to 16-bit q/k (float32 and float64 are unchanged). Softmax total
  variation against float64 (``pe-bench bench --pape-precision``): see the README.
  float16 (``precision: 16-mixed``) ends at 65504, and the query's offset column grows as
  m |a| |s|^2 (1e5 at 150 x 150 positions) against its key column's 1: with float16 q/k each
  pair of columns is first balanced by powers of two (``balanced_for_float16``), exactly,
  so that the features stay finite at large extents.
  Frames (``frame_tile``): the split keeps the forward exact, but not training's gradients:
  the kernel's backward rounds dS and dq to 16 bits before the positional columns of dq
  combine, and those columns carry the same cancellation (``pe-bench bench
  --pape-precision``: 6 % error in the positional gradients at 14 x 14, 100 % at 64 x 64).
  Its size follows |s| / |Δs|, the distance of the attended keys from the frame's origin.
  With ``frame_tile: t`` the attention core attends each tile of t cells per grid axis
  (chunks of t^P consecutive tokens without a grid) separately (``query_groups``), and
  each tile's frame is centred on its own queries: the attended keys sit near the origin,
  and far keys' terms are about as large as their own, strongly negative, logits. Exact
  (a translation per tile; tested against the explicit form), and with the narrow
  rounded features (``low_precision: round``, width 168 at m = 50) and 4 x 4 tiles the
  softmax error stays within 2.1x of the content logits' own bf16 rounding and the
  gradients' within 1.7x of the content gradients', at every grid from 14 x 14 to 128 x 128. The cost: one attention
  call per tile, and every tile holds its own widened features of all keys (T copies of k:
  keep T small, e.g. 4 tiles of 7 x 7 at 14 x 14).
  Positional bias (``low_precision: bias``): with 16-bit q/k, the widened features' product
  <f_q_i, f_k_j> is not folded into q and k but formed to float32 accuracy as a (B, H, Nq,
  Nk) bias (``positional_bias``), rounded to 16 bits only after the cancellation, and SDPA
  runs the unwidened 16-bit heads with that bias. Its backward is that product's, to
  float32 accuracy: the kernel returns dS rounded per pair (a relative error of each pair's
  own term), and the positional columns combine in float32. No frames or tiles are needed.
  The product runs on the 16-bit matrix units, each float32 feature as three bf16 pieces
  (adapters/_float32_product.py; until stop 52 an IEEE float32 matmul, which TF32 would
  have rounded to 10 bits and so was refused), and its float32 sums are rounded once, to
  q's dtype, in which SDPA takes the bias and returns its gradient. The cost is the N x N
  bias: (B, H, Nq, Nk) per layer in 16 bits (and briefly in float32), which fits small grids
  (ViT-B at 224²: 0.47M elements per sample and layer), plus six bf16 products per feature. 32-bit q/k keep the widened
  form, which is exact there.
  Position space (``space``): s = W_p r is linear in the P-dimensional r, so Eq. 9 is a
  quadratic form in the raw offset Δr = r_j - r_i, with M_i = W_p^T diag(a_i) W_p (P x P,
  negative semi-definite when a_i < 0) and β_i = W_p^T b_i:
      S_ij - <q_i, k_j> = <a_i, (W_p Δr)^2> + <b_i, W_p Δr> = Δr^T M_i Δr + <β_i, Δr>.
  Factorised as above,
      f_q = (r_i^T M_i r_i - <β_i, r_i>) ⊕ {M_i,pq (x2 off the diagonal)}_{p<=q} ⊕ (β_i - 2 M_i r_i)
      f_k = 1 ⊕ {r_j,p r_j,q}_{p<=q} ⊕ r_j,
  1 + P(P+1)/2 + P features instead of 2m + 1: 6 instead of 101 for images at m = 50 (with
  the split, a head of 64 + 18 -> 88 columns instead of 368, within the fused kernels' 256),
  10 for 3-D positions. The keys' features hold positions only, so every head and layer
  shares one tensor of them. A query's cost in m is a_i's: its W_a rows and one small
  product with the outer products W_p,c W_p,c^T of W_p's rows. β_i = W_p^T W_b x_i comes
  from a (H P, D) weight folded from W_b and W_p once per call (with ``context``), so the
  coefficient projection computes H (m + P) columns instead of 2 H m (624 instead of 1200
  for ViT-B at m = 50, beside qkv's 2304). The same logits, in another rounding: the
  identity is exact, and the cancellation is the same (|M| |r|^2 terms down to |M| |Δr|^2),
  so the split, the frames and the bias form apply unchanged. The paper writes the
  factorisation in the projected space (Eq. 13-14), and the stored records were trained
  that way on CPU, so "auto" (default) takes position space on CUDA only, where the
  narrower head keeps SDPA's fastest kernels, and only where it is narrower
  (P(P+1)/2 + P < 2m at full PaPE: m >= 3 for P = 2); "projected" or "position" force one.
  Without W_p (``project`` False) position space is the projected one with W_p = I, wider
  by the P(P-1)/2 cross terms. The explicit form (below) takes position space only when
  asked (``space: position``): then each (query, key) pair evaluates Δr^T M_i Δr + <β_i, Δr>
  from its own offset, P differences and P(P+1)/2 + P products (5 for images) instead of
  Eq. 9's m terms, in its dense bias (per-pair tensors shared by the heads) and in its
  FlexAttention score_mod alike.
* ``explicit``: the bias of Eq. 9 built as a (B, H, Nq, Nk) tensor: the reference oracle
  and the memory comparison. Its FlexAttention form (``score_mod``, used on CUDA) evaluates
  Eq. 9 with the direct differences Δr_ij per (query, key) pair inside the kernel, from
  the (B, H, N, m) tensors s, a and b: the same oracle with memory linear in the tokens.

The ablations of Table 2 are options: ``quadratic``/``linear`` drop a term, ``context``
False learns a and b per layer and head but shares them across tokens, ``softplus`` False
removes a's activation, ``project`` False removes W_p (m = P). ``m`` is Table 3's m.

CLS: pe-bench keeps tokens without a position out of the bias: a and b of a CLS query are
zeroed and a CLS key's positional channels are zero, so the CLS row and column carry no
positional term. The official code (DTU-PAS/parabolic-position-encoding) gives the CLS
the position (0, 0), next to patches at (1..W, 1..H), and encodes it like any token, so
there the CLS's logits depend on its offsets to the patches; it also uses the raw
positions where pe-bench centres them on the keys (exact by translation invariance).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from ._flex import indexed_once
from ._float32_product import float32_product, keys_for_product
from ._fused import FusedFunction
from ._rounding import rounded_pieces
from .base import (
    AttentionInputs,
    EncodingOptions,
    LayerEncoding,
    PositionEncoding,
    Principle,
    ScoreMod,
    at_least_float32,
    first_sample_if_shared,
    grid_tiles,
    group_centred_coords,
    key_centred_coords,
    shared_by_query_chunks,
    shared_per_forward,
)
from .registry import register

LOW_PRECISION = (torch.bfloat16, torch.float16)


class WidenedFormOptions(EncodingOptions):
    """What PaPE's and PaPE-RI's options share: the efficient form's frames (module doc). Each
    declares the fields ``form``, ``pad_to``, ``low_precision`` and ``frame_tile`` itself,
    in the order its messages list them (PaPE's ``m`` first)."""

    @model_validator(mode="after")
    def _tiles_need_the_efficient_form(self) -> WidenedFormOptions:
        if self.frame_tile is not None and self.form == "explicit":
            raise ValueError(
                "frame_tile applies to form 'efficient' only (the explicit form has no frame"
                " to move: it takes r_j - r_i directly); drop frame_tile or use form: efficient"
            )
        if self.frame_tile is not None and self.low_precision == "bias":
            raise ValueError(
                "frame_tile does not combine with low_precision 'bias' (the bias form's"
                " float32 logits and gradients need no frames); drop frame_tile, or use"
                " low_precision 'round' with frame_tile"
            )
        return self

    def positional_bias_form(self, q: Tensor) -> bool:
        """Whether the efficient form runs as a float32 positional bias for these q/k
        (``low_precision: bias`` with 16-bit q/k; the module doc's "Positional bias")."""
        return self.form == "efficient" and self.low_precision == "bias" and q.dtype in LOW_PRECISION

    @property
    def tiled(self) -> bool:
        return self.frame_tile is not None and self.form == "efficient"


def frame_dtype(inputs: AttentionInputs) -> torch.dtype:
    """The frames' dtype: at least float32 (bf16 would ruin the s_i^2 + s_j^2 - 2 s_i s_j
    cancellation), float64 when the positions or the layer are (a float64 reference fed a
    float32 grid keeps float64 features)."""
    return at_least_float32(inputs.query.coords.dtype, inputs.x_q.dtype)


def frame_coords(options: WidenedFormOptions, inputs: AttentionInputs, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Query and key positions in the efficient form's frame: centred on this tile's queries
    with ``frame_tile``, else on the keys; zero for tokens without a position."""
    if options.tiled:
        r_q, r_k = group_centred_coords(inputs, dtype)
    else:
        r_q, r_k = key_centred_coords(inputs, dtype)
    return positions_only(r_q, r_k, inputs)


def positions_only(r_q: Tensor, r_k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
    """r_q and r_k with the rows of tokens without a position zeroed (the same tensor twice
    when r_k is r_q). Their coordinates are to be ignored (``PositionLayout``), and every
    positional term of such a token is multiplied by a zero flag: NaN * 0 is NaN, so a stray
    non-finite coordinate of a CLS token would reach every logit through its row and column.
    Zeroing by ``where`` keeps finite inputs' bits: where a flag is 0 the products were
    zeros already (of either sign, which no sum of nonzero terms sees). The origin the
    positions are centred on is base's ``masked_mean`` of the positioned tokens, which must
    leave such tokens out by ``where`` too. The flags are those of the samples the positions
    hold (``first_sample_if_shared``, as ``key_centred_coords``)."""
    layouts = first_sample_if_shared(inputs)
    q_pos = torch.where(layouts.query.has_pos.unsqueeze(-1), r_q, 0.0)
    k_pos = q_pos if r_k is r_q else torch.where(layouts.key.has_pos.unsqueeze(-1), r_k, 0.0)
    return q_pos, k_pos


def frame_tiles(options: WidenedFormOptions, inputs: AttentionInputs) -> list[Tensor] | None:
    """``frame_tile``'s tiles of queries (once per forward), each attended in its own frame."""
    if not options.tiled:
        return None
    edge = options.frame_tile
    return shared_per_forward(inputs, ("query-tiles", edge), lambda: grid_tiles(inputs.query, edge))


def positioned_keys(features: Tensor, inputs: AttentionInputs) -> Tensor:
    """The keys' (B or 1, H, Nk, w) positional features with the rows of keys without a
    position zeroed: they contribute nothing positional. Zeroed by ``where``, not a product,
    so that nothing non-finite in such a row survives (``positions_only``). The flags are
    those of the samples the frame's positions hold: one sample when the batch shares its
    positions (``first_sample_if_shared``, as ``key_centred_coords``)."""
    return torch.where(first_sample_if_shared(inputs).key.has_pos[:, None, :, None], features, 0.0)


class PaPEOptions(WidenedFormOptions):
    m: int = Field(50, ge=1)
    form: Literal["efficient", "explicit"] = "efficient"
    quadratic: bool = True
    linear: bool = True
    context: bool = True
    softplus: bool = True
    project: bool = True
    pad_to: int = Field(8, ge=1)
    #: widened features with 16-bit q/k: "split" (hi + lo, float32-accurate), "round", or
    #: "bias" (their product as a float32 N x N bias; module doc, "Positional bias").
    low_precision: Literal["split", "round", "bias"] = "split"
    #: efficient form: give every tile of frame_tile cells per grid axis (chunks of
    #: frame_tile^P tokens without a grid) its own frame, centred on its queries (None: one
    #: frame for all queries, centred on the keys). See the module doc, "Frames".
    frame_tile: int | None = Field(None, ge=1)
    #: the space PaPE works in (module doc, "Position space"): "projected" (s = W_p r, 2m + 1
    #: features: Eq. 13-14, the stored records' arithmetic), "position" (r itself, 1 + P(P+1)/2
    #: + P features; the explicit form: the offsets' quadratic form per pair), or "auto":
    #: position for the efficient form on CUDA where it is narrower, projected elsewhere.
    space: Literal["auto", "projected", "position"] = "auto"


def widen_heads(
    q: Tensor, k: Tensor, q_extra: Tensor, k_extra: Tensor, split: bool, pad_to: int
) -> tuple[Tensor, Tensor]:
    """q ⊕ q_extra and k ⊕ k_extra in q's dtype, zero-padded to a multiple of ``pad_to``.

    ``split`` with 16-bit q/k: the (float32) extra features become hi/lo pairs so that
    <q_ext, k_ext> keeps <q_extra, k_extra> to float32 accuracy (see module doc).
    Each widened head is written by one concatenation, the zero padding included: padding
    the concatenated head afterwards would copy the whole widened q and k once more (a
    third of PaPE's bytes written per training step at m = 50 went to that copy).

    On CUDA ("auto") the concatenations run as one compiled function (``FUSED_WIDENING``):
    eager, ``cat`` reads q and k, strided views of the fused qkv projection, through a generic
    kernel, and the backward copies their gradients out of the widened ones. Profiled on an
    H100 (11-28, ViT-B/16 at batch 128, bf16, three training steps) PaPE-RI spent 14.4 ms in
    ``cat`` (nopos 3.3) and 28.2 ms in copies (nopos 17.4), most of its 35 ms over nopos.
    Compiled, Inductor writes each widened head in one pass over its parts. The split stays
    eager, outside the compiled function: with Inductor's defaults a value cast to 16 bits
    stays float32 inside a fused kernel, so f - hi compiled was 0 and the lo half vanished
    (tests/adapters/test_fused_widening.py caught it). ``_fused.INDUCTOR_OPTIONS`` keeps such
    roundings in torch 2.14 but not in 2.11, so the split's bits rest on no compiler setting:
    eager here, and an opaque operator where the whole model is compiled (``_rounding``).
    Concatenating and slicing are exact, so the fused form is the eager one to the bit,
    forward and backward.

    float16 q/k: the feature columns are first balanced (``balanced_for_float16``), so that
    none exceeds float16's range; bf16, float32 and float64 are left as they are.
    """
    if q.dtype == torch.float16:
        q_extra, k_extra = balanced_for_float16(q_extra, k_extra)
    if split and q.dtype in LOW_PRECISION:
        # The gradient passes through hi alone (rounding taken as the identity): lo = f - hi
        # has derivative 1 - 1 = 0 in f, which autograd would otherwise form as a sum of
        # +g and -g, four operators more per side in the backward and a rounding error.
        # Compiled, the halves are cut by an operator the compiler cannot fuse into
        # (``_rounding``: torch 2.11's Inductor lost lo here even with INDUCTOR_OPTIONS).
        q_hi, q_lo = rounded_pieces(q_extra, q.dtype, 2)
        k_hi, k_lo = rounded_pieces(k_extra, k.dtype, 2)
        q_tail, k_tail = [q_hi, q_hi, q_lo], [k_hi, k_lo, k_hi]
    else:
        q_tail, k_tail = [q_extra.to(q.dtype)], [k_extra.to(k.dtype)]
    eager = lambda: _joined_pair(q, k, q_tail, k_tail, pad_to)  # noqa: E731
    return FUSED_WIDENING(eager, q, k, q_tail, k_tail, pad_to)


#: the largest magnitude a float16 feature column keeps (``balanced_for_float16``): float16's
#: largest number is 65504, just below 2^16, and a power of two below that leaves its hi
#: pieces room to round up
FLOAT16_FEATURE_LIMIT = 2.0**15


def balanced_for_float16(q_extra: Tensor, k_extra: Tensor) -> tuple[Tensor, Tensor]:
    """q_extra and k_extra with each pair of matching columns c scaled by 2^-e_c and 2^e_c:
    the least power of two that brings the larger side within ``FLOAT16_FEATURE_LIMIT`` (e_c = 0,
    nothing scaled, where both fit). Without it the float16 features overflow at large extents:
    the query's offset column <a_i, s_i^2> - <b_i, s_i> grows as m |a| |s|^2 (about 1e5 at
    ViT-like weights on 150 x 150 positions), while its key column is 1. Scaling by a power of
    two is exact, and commutes with rounding to float16 (pieces that stay float16 normals), so
    every product of the kernel, hi_q 2^-e * lo_k 2^e say, is the unscaled product to the bit,
    and so is every gradient, which the same powers of two scale back in float32. A column pair
    whose largest product exceeds about 2^30 cannot be balanced (both sides beyond the limit);
    there the float32 sums have lost the parabola's cancellation anyway (positions 1e4 apart)."""
    shift = _exponent_beyond_the_limit(k_extra) - _exponent_beyond_the_limit(q_extra)
    return q_extra * _power_of_two(shift), k_extra * _power_of_two(-shift)


def _exponent_beyond_the_limit(features: Tensor) -> Tensor:
    """Per column (the last axis): the least e >= 0 with max |column| / 2^e within
    ``FLOAT16_FEATURE_LIMIT``, as an int32 tensor. A column with a non-finite entry keeps
    e = 0: its NaN stays in its own rows."""
    largest = features.detach().abs().amax(dim=tuple(range(features.dim() - 1))).float()
    largest = torch.where(largest.isfinite(), largest, 0.0)
    return (largest / FLOAT16_FEATURE_LIMIT).clamp_min(1.0).log2().ceil().to(torch.int32)


def _power_of_two(exponent: Tensor) -> Tensor:
    """2^exponent as float32, written as its bits (biased exponent, zero mantissa): exact by
    construction, where exp2 is exact only as far as each backend's implementation is. The
    exponent is kept to float32's normal range (|e| <= 126; float16's features need far less)."""
    return ((exponent.clamp(-126, 126) + 127) << 23).view(torch.float32)


def _joined_pair(
    q: Tensor, k: Tensor, q_tail: list[Tensor], k_tail: list[Tensor], pad_to: int
) -> tuple[Tensor, Tensor]:
    """q ⊕ q_tail and k ⊕ k_tail, each zero-padded to a multiple of ``pad_to``."""
    return _joined_and_padded([q, *q_tail], pad_to), _joined_and_padded([k, *k_tail], pad_to)


def _joined_and_padded(parts: list[Tensor], multiple: int) -> Tensor:
    """``parts`` concatenated along the head, then zero columns up to a multiple of ``multiple``
    (fused kernels prefer it), in one copy."""
    lead = parts[0].shape[:-1]
    pad = -sum(t.shape[-1] for t in parts) % multiple
    if pad:
        parts = [*parts, parts[0].new_zeros(*lead, pad)]
    return torch.cat([t.expand(*lead, -1) for t in parts], dim=-1)


#: ``widen_heads``' concatenations as one compiled function; ``FUSED_WIDENING.chosen`` ("auto":
#: fused on CUDA) is ``pe-bench bench --widening-kernel``. Variants: one per dtype, number of
#: parts, padding, layout and grad mode (PaPE and PaPE-RI, bf16 training and float32
#: evaluation); shapes beyond the first become dynamic.
FUSED_WIDENING = FusedFunction(
    _joined_pair, "the fused widening of PaPE's heads", "pape.FUSED_WIDENING.chosen('eager')", 64
)


def positional_bias(q_extra: Tensor, k_extra: Tensor, q: Tensor, inputs: AttentionInputs) -> Tensor:
    """<q_extra_i, k_extra_j> / sqrt(head_dim), the efficient form's positional logits, as a
    (B, H, Nq, Nk) bias for the 16-bit heads ``q``, outside autocast, which would run the
    product in 16 bits and cancel the parabola's terms there. Float32 features multiply on
    the 16-bit matrix units to float32 accuracy (``_float32_product``: each number as three
    bf16 pieces, so TF32 settings do not touch them), and the sum is rounded once, to q's
    dtype, in which SDPA takes the bias; float64 ones (tests) multiply as they are, in
    float64. The keys' pieces are cut once per attention call (``shared_by_query_chunks``).
    In float16, logits below -65504 (far keys at large extents) round to -inf: their softmax
    weight, e^-65504 against the row's largest logit, is 0 in float32 too; only a row whose
    every key is that far (cross-attention to distant keys alone) would have no weight left."""
    # the scale on the (.., N, 2m + 1) features, not on the N x N product: a pass over the
    # smaller tensor, forward and backward (exact where sqrt(head width) is a power of two:
    # widths 16, 64, 256; otherwise one float32 rounding of each feature)
    scaled = q_extra / math.sqrt(q.shape[-1])
    if scaled.dtype == torch.float32:
        # position space's keys are one tensor for all heads: the product takes one per head
        keys = shared_by_query_chunks(
            inputs,
            "positional-bias-keys",
            lambda: keys_for_product(k_extra.to(torch.float32).expand(-1, q.shape[1], -1, -1)),
        )
        return float32_product(scaled, keys, out_dtype=q.dtype)
    with torch.autocast(q_extra.device.type, enabled=False):
        return scaled @ k_extra.to(scaled.dtype).transpose(-1, -2)


def feature_widths(options: PaPEOptions, pos_dim: int) -> dict[str, int]:
    """The efficient form's positional features per token (before the split and padding)
    in each ``space``: 1 + m (quadratic) + m, and 1 + P(P+1)/2 (quadratic) + P."""
    m = options.m if options.project else pos_dim
    quadratic = int(options.quadratic)
    return {"projected": 1 + quadratic * m + m, "position": 1 + quadratic * pos_dim * (pos_dim + 1) // 2 + pos_dim}


def in_position_space(options: PaPEOptions, pos_dim: int, device_type: str) -> bool:
    """Whether PaPE works from r itself (``space``; module doc, "Position space"): asked for,
    or "auto" on CUDA where that widens the efficient form's head less (the explicit form,
    the reference, keeps projected space unless asked). The FLOP model asks the same."""
    if not (options.quadratic or options.linear):
        return False  # no positional term: its zero columns are the same in either space
    if options.space != "auto":
        return options.space == "position"
    if options.form == "explicit":
        return False  # the reference: Eq. 9's m terms as written, unless position space is asked for
    widths = feature_widths(options, pos_dim)
    return device_type == "cuda" and widths["position"] < widths["projected"]


def query_mask(inputs: AttentionInputs, dtype: torch.dtype) -> Tensor:
    """(B, 1, Nq, 1): 1 for queries with a position, 0 for the others (CLS), in ``dtype``;
    once per forward."""
    return shared_per_forward(inputs, ("query-mask", dtype), lambda: inputs.query.has_pos[:, None, :, None].to(dtype))


def pair_buffers(pos_dim: int) -> tuple[Tensor, Tensor]:
    """Position space's pairs p <= q of the P coordinates (the T = P(P+1)/2 quadratic
    features): their (rows, cols, flat index p P + q) as a (3, T) tensor, and the (P^2, T + P^2)
    selection that takes a flattened (P, P) matrix M to its triangle, doubled off the diagonal
    (r^T M r = sum over pairs of weight M_pq r_p r_q), then to itself."""
    rows, cols = torch.triu_indices(pos_dim, pos_dim)
    flat = rows * pos_dim + cols
    triangle = torch.zeros(pos_dim * pos_dim, len(flat))
    triangle[flat, torch.arange(len(flat))] = torch.where(rows == cols, 1.0, 2.0)
    return torch.stack([rows, cols, flat]), torch.cat([triangle, torch.eye(pos_dim * pos_dim)], dim=1)


def pape_bias_elements(options: WidenedFormOptions, q: Tensor, k: Tensor, per_pair: int) -> int:
    """``dense_bias_elements`` of PaPE and PaPE-RI: the explicit form's per-pair tensor
    (``per_pair`` values for each of every sample's pairs), the positional bias form's
    (B, H, Nq, Nk) logits, and nothing for the widened q/k, which build no bias."""
    pairs = q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2]  # a and b (alpha) are every sample's own
    if options.form == "explicit":
        return pairs * per_pair
    return pairs if options.positional_bias_form(q) else 0


class ParabolicLayer(LayerEncoding):
    bias_by_query_chunks = True  # a query's a_i, b_i and s_i against every key, in the keys' frame

    def __init__(self, dim: int, num_heads: int, pos_dim: int, options: PaPEOptions) -> None:
        super().__init__()
        self.options = options
        self.num_heads = num_heads
        self.m = options.m if options.project else pos_dim
        if options.project:
            bound = 1.0 / math.sqrt(pos_dim)  # nn.Linear's default init for W_p (fan_in = P)
            self.w_p = nn.Parameter(torch.empty(num_heads, self.m, pos_dim).uniform_(-bound, bound))
        else:
            self.register_parameter("w_p", None)
        # position space's pairs of coordinates (``pair_buffers``), buffers so that they follow
        # the layer's device (made outside any inference mode, which autograd would refuse)
        self.pos_dim = pos_dim
        indices, selection = pair_buffers(pos_dim)
        self.register_buffer("pair_indices", indices, persistent=False)
        self.register_buffer("pair_selection", selection, persistent=False)
        #: the pairs (p, q) as Python numbers, for the score_mod (a kernel's Python, not tensors)
        self.coordinate_pairs = list(zip(*indices[:2].tolist(), strict=True))
        n_coef = int(options.quadratic) + int(options.linear)
        if options.context:
            self.w_ab = nn.Linear(dim, n_coef * num_heads * self.m, bias=False)
        else:
            self.ab = nn.Parameter(torch.empty(n_coef, num_heads, self.m).uniform_(-1.0, 1.0))

    def project(self, coords: Tensor) -> Tensor:
        """(B, N, P) -> s = W_p r: (B, H, N, m), in ``coords``' dtype even under autocast
        (which would otherwise run the einsum as a bf16 matmul)."""
        if self.w_p is None:
            return coords.unsqueeze(1).expand(-1, self.num_heads, -1, -1)
        with torch.autocast(coords.device.type, enabled=False):
            return torch.einsum("bnp,hmp->bhnm", coords, self.w_p.to(coords.dtype))

    def coefficients(self, x_q: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """a (Eq. 7) and b (Eq. 8) per query, (B, H, Nq, m) each (None when ablated)."""
        b_, n, _ = x_q.shape
        if self.options.context:
            raw = self.w_ab(x_q).view(b_, n, -1, self.num_heads, self.m).permute(2, 0, 3, 1, 4)
        else:
            raw = self.ab[:, None, :, None, :].expand(-1, b_, -1, n, -1)
        raw = list(raw.unbind(0))
        a = b = None
        if self.options.quadratic:
            a_raw = raw.pop(0)
            a = -F.softplus(a_raw) if self.options.softplus else a_raw
        if self.options.linear:
            b = raw.pop(0)
        return a, b

    def _frame(self, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """Projected query and key positions in a shared frame: centred on the keys, or with
        ``frame_tile`` on this tile's queries (``inputs`` then holds one tile's queries)."""
        r_q, r_k = frame_coords(self.options, inputs, frame_dtype(inputs))
        s_q = self.project(r_q)
        if r_k is r_q:
            return s_q, s_q
        return s_q, shared_by_query_chunks(inputs, ("pape-s-k", r_k.dtype), lambda: self.project(r_k))

    def query_groups(self, inputs: AttentionInputs) -> list[Tensor] | None:
        return frame_tiles(self.options, inputs)

    def _coefficients_for_queries(
        self, inputs: AttentionInputs, dtype: torch.dtype
    ) -> tuple[Tensor | None, Tensor | None]:
        """a and b in the frame's ``dtype``, zeroed for queries without a position (CLS): one
        pass, which also casts them exactly when they are 16-bit (autocast). In the frame's
        dtype their gradient's terms (d offset s^2, d a, -2 s d linear; size |dS| s^2 each)
        add up there; in 16 bits the parabola's cancellation down to |dS| (s_i - s_j)^2 would
        happen in 16 bits (a 3.8 % error of PaPE's positional gradients at 14 x 14 in
        bench --pape-precision, with the positional bias form)."""
        mask = query_mask(inputs, dtype)
        a, b = self.coefficients(inputs.x_q)
        return (None if a is None else a * mask), (None if b is None else b * mask)

    def _position_space_coefficients(
        self, inputs: AttentionInputs, dtype: torch.dtype, w_p: Tensor, whole: bool
    ) -> tuple[Tensor | None, Tensor | None]:
        """M_i's coefficients (B, H, Nq, T [+ P^2 with ``whole``], ``_quadratic_form``) and
        β = W_p^T b (B, H, Nq, P), from a and b as ``_coefficients_for_queries`` gives them.
        With ``context``, β comes from x_q directly: W_b and W_p are folded into one (H P, D)
        weight per call, so W_ab's matrix product computes H P columns for the linear term
        instead of H m (the rows of W_ab are a's, then b's); and a stays in the projection's
        layout (token-major) until it has met W_p's outer products, so no (B, H, Nq, m) copy of
        it exists (until stop 56 its mask and the heads' transpose made two)."""
        if not (self.options.context and self.options.linear):
            a, b = self._coefficients_for_queries(inputs, dtype)
            m_coefficients = None if a is None else self._quadratic_form(a, w_p, whole)
            if b is None:
                return m_coefficients, None
            with torch.autocast(b.device.type, enabled=False):  # autocast would run it in bf16
                return m_coefficients, b @ w_p
        weight, heads, pos_dim = self.w_ab.weight, self.num_heads, w_p.shape[-1]
        a_rows = weight.shape[0] - self.m * heads
        w_a, w_b = weight.split([a_rows, self.m * heads])  # split, not slices: one cat backward
        with torch.autocast(weight.device.type, enabled=False):  # the fold in the weights' dtype
            w_beta = w_p.to(weight.dtype).transpose(1, 2) @ w_b.unflatten(0, (heads, self.m))  # (H, P, D)
        folded = torch.cat([w_a, w_beta.flatten(0, 1)]) if self.options.quadratic else w_beta.flatten(0, 1)
        raw = F.linear(inputs.x_q, folded)  # under autocast as W_ab's own product would be
        a_raw, beta_raw = raw.split([a_rows, heads * pos_dim], dim=-1)
        mask = query_mask(inputs, dtype)  # each product by it is also the cast to ``dtype``
        beta = beta_raw.unflatten(-1, (heads, pos_dim)).transpose(1, 2) * mask
        if not self.options.quadratic:
            return None, beta
        # a = -softplus(.) zeroed off position: the sign and the zeros commute exactly with the
        # product, so they go on M's T (+ P^2) columns after it, in one product with -mask.
        # softplus before the heads' transpose: its backward then reads two tensors of one
        # layout, whose output layout a compiled backward (AOTAutograd) predicts as the eager
        # CPU kernel makes it (after the transpose it did not, and its view of the gradient failed)
        if self.options.softplus:
            a_raw, mask = F.softplus(a_raw), shared_per_forward(inputs, ("negative-query-mask", dtype), lambda: -mask)
        with torch.autocast(a_raw.device.type, enabled=False):
            a = a_raw.to(dtype).unflatten(-1, (heads, self.m)).transpose(1, 2)  # a view: (B, H, Nq, m)
        return self._quadratic_form(a, w_p, whole) * mask, beta

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        if self.options.form == "explicit" or self.options.positional_bias_form(q):
            return q, k
        split = self.options.low_precision == "split"
        return widen_heads(q, k, *self._extra_features(inputs), split, self.options.pad_to)

    def in_position_space(self, device: torch.device) -> bool:
        """Whether PaPE works from r itself on ``device`` (``in_position_space``)."""
        return in_position_space(self.options, self.pos_dim, device.type)

    def _extra_features(self, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """The efficient form's positional features f_q (B, H, Nq, w) and f_k (B or 1, H or
        1, Nk, w) in the frame's dtype, zero for tokens without a position: w = 2m + 1 in
        projected space, 1 + P(P+1)/2 + P in position space. f_k once per attention call when
        its queries come in chunks (``shared_by_query_chunks``)."""
        if self.in_position_space(inputs.x_q.device):
            return self._position_space_features(inputs)
        s_q, s_k = self._frame(inputs)
        # a query's every feature is a or b times something, so with a and b zeroed for
        # queries without a position their features are 0 with no pass of their own
        a, b = self._coefficients_for_queries(inputs, s_q.dtype)
        # Features in the frame's dtype (at least float32): the cancellation happens there.
        # Each term is built once, without zero-initialised accumulators (0 + x and 0 - x
        # are x and -x exactly, so this gives the bits of the sum written out term by term).
        q_parts, offset_q, square = [], None, None
        if a is not None:
            square = s_q.square()
            offset_q = (a * square).sum(-1, keepdim=True)
            a_s = a * s_q
            q_parts.append(a)
        if b is not None:
            offset_b = (b * s_q).sum(-1, keepdim=True)
            offset_q = -offset_b if offset_q is None else offset_q - offset_b
        linear_q = b
        if a is not None:  # b - 2 a s in one pass: (a s) * -2 is exact (a power of two), so
            # b + (-2) (a s) rounds once, as the sum written out would, fused multiply-add or not
            linear_q = a_s * -2 if b is None else torch.add(b, a_s, alpha=-2)
        if offset_q is None:  # neither term (an ablation of both): the positional columns are 0
            offset_q, linear_q = torch.zeros_like(s_q[..., :1]), torch.zeros_like(s_q)
        q_extra = torch.cat([offset_q, *q_parts, linear_q], dim=-1)
        square_k = square if s_k is s_q else None  # self-attention: the queries' squares are the keys'
        k_extra = shared_by_query_chunks(
            inputs, ("pape-key-features", s_k.dtype), lambda: self._key_features(s_k, square_k, inputs)
        )
        return q_extra, k_extra

    def _position_space_features(self, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """f_q = (r_i^T M_i r_i - <β_i, r_i>) ⊕ M_i's upper triangle (off-diagonal entries
        doubled) ⊕ (β_i - 2 M_i r_i) and f_k = 1 ⊕ r_j's pairwise products ⊕ r_j, with
        M_i = W_p^T diag(a_i) W_p and β_i = W_p^T b_i (module doc, "Position space"). The
        keys' features hold positions only: one (B or 1, 1, Nk, w) tensor for every head, and
        for every layer too when the frame is the keys' (not ``frame_tile``'s)."""
        r_q, r_k, triangle, form, beta = self._position_space_terms(inputs, whole=True)
        r_i = r_q.unsqueeze(1)  # (B or 1, 1, Nq, P): the same for every head
        q_parts, m_r = [], None
        if triangle is not None:
            q_parts.append(triangle)
            m_r = (form * r_i.unsqueeze(-2)).sum(-1)  # M_i r_i
        # offset r_i^T M_i r_i - <β_i, r_i> = <M_i r_i - β_i, r_i>, and the linear columns
        # β_i - 2 M_i r_i (the scaling by -2 is exact), as in projected space
        if m_r is not None and beta is not None:
            offset, linear = ((m_r - beta) * r_i).sum(-1, keepdim=True), torch.add(beta, m_r, alpha=-2)
        elif m_r is not None:
            offset, linear = (m_r * r_i).sum(-1, keepdim=True), m_r * -2
        else:  # linear term alone (in_position_space excludes ablating both)
            offset, linear = -(beta * r_i).sum(-1, keepdim=True), beta
        q_extra = torch.cat([offset, *q_parts, linear], dim=-1)

        def keys() -> Tensor:
            parts = [torch.ones_like(r_k[..., :1])]
            if self.options.quadratic:
                rows, cols, _ = self.pair_indices
                parts.append(r_k[..., rows] * r_k[..., cols])
            parts.append(r_k)
            return positioned_keys(torch.cat(parts, dim=-1).unsqueeze(1), inputs)

        name = ("pape-position-key-features", r_k.dtype, self.options.quadratic)
        if not self.options.tiled:  # positions alone, in the keys' frame: every layer's
            return q_extra, shared_by_query_chunks(inputs, name, lambda: shared_per_forward(inputs, name, keys))
        return q_extra, keys()

    def _quadratic_form(self, a: Tensor, w_p: Tensor, whole: bool) -> Tensor:
        """M_i = W_p^T diag(a_i) W_p per query from a (B, H, Nq, m), in a's dtype outside
        autocast (which would run it in bf16): its upper triangle (off-diagonal entries
        doubled: r^T M r = sum over pairs p <= q of that times r_p r_q), T columns, and with
        ``whole`` the whole M_i after them, P^2 more; (B, H, Nq, T [+ P^2]), from one product
        of a with W_p's rows' outer products W_p,c ⊗ W_p,c. The product is one matrix per head
        over all the batch's queries, (H, B Nq, m): a view of a token-major a (the
        projection's layout), so the queries are never copied into the heads' order."""
        batch, heads, queries, m = a.shape
        selection = self.pair_selection if whole else self.pair_selection[:, : self.pair_indices.shape[-1]]
        with torch.autocast(a.device.type, enabled=False):
            outer = (w_p.unsqueeze(-1) * w_p.unsqueeze(-2)).flatten(-2) @ selection.to(a.dtype)  # (H, m, T [+ P^2])
            by_head = a.transpose(0, 1).reshape(heads, batch * queries, m)  # a view when a is token-major
            coefficients = torch.bmm(by_head, outer)
        return coefficients.unflatten(1, (batch, queries)).transpose(0, 1)

    def _position_space_terms(self, inputs: AttentionInputs, whole: bool) -> tuple[Tensor | None, ...]:
        """What position space builds on, in the frame's dtype: the positions r_q (B or 1,
        Nq, P) and r_k (B or 1, Nk, P) in the frame, M_i's doubled triangle (B, H, Nq, T),
        with ``whole`` the whole M_i (B, H, Nq, P, P) (else None), and β_i (B, H, Nq, P);
        M_i's parts are None without the quadratic term, β_i without the linear one.
        S_ij = sum_t tri_i,t Δr_p Δr_q + <β_i, Δr>."""
        dtype = frame_dtype(inputs)
        r_q, r_k = frame_coords(self.options, inputs, dtype)
        w_p = self._projection(dtype, r_q.device)  # (H, m, P)
        m_coefficients, beta = self._position_space_coefficients(inputs, dtype, w_p, whole)
        triangle = form = None
        if m_coefficients is not None and whole:
            pos_dim = w_p.shape[-1]
            triangle, form = m_coefficients.split([self.pair_indices.shape[-1], pos_dim * pos_dim], dim=-1)
            form = form.unflatten(-1, (pos_dim, pos_dim))
        elif m_coefficients is not None:
            triangle = m_coefficients
        return r_q, r_k, triangle, form, beta

    def _position_space_bias(self, q: Tensor, inputs: AttentionInputs) -> Tensor:
        """Eq. 9 per (query, key) pair from the offsets themselves, (B, H, Nq, Nk): the
        per-pair tensors are (B or 1, Nq, Nk, T + P), shared by the heads."""
        r_q, r_k, triangle, _, beta = self._position_space_terms(inputs, whole=False)
        delta = r_k.unsqueeze(1) - r_q.unsqueeze(2)  # (B or 1, Nq, Nk, P): r_j - r_i
        out = None
        if triangle is not None:
            rows, cols, _ = self.pair_indices
            out = torch.einsum("bhit,bijt->bhij", triangle, delta[..., rows] * delta[..., cols])
        if beta is not None:
            linear = torch.einsum("bhip,bijp->bhij", beta, delta)
            out = linear if out is None else out + linear
        return out * inputs.key.has_pos[:, None, None, :] / math.sqrt(q.shape[-1])

    def _position_space_score_mod(self, q: Tensor, inputs: AttentionInputs) -> ScoreMod:
        """``_position_space_bias`` inside the kernel: per pair P differences, T + P products."""
        r_q, r_k, triangle, _, beta = self._position_space_terms(inputs, whole=False)
        # every sample's row, one copied tensor per column (``score_mod`` and ``indexed_once``
        # on expanded kernel inputs); positions carry no gradient, the coefficients do
        r_q_cols, r_k_cols = (indexed_once(r.expand(q.shape[0], -1, -1)) for r in (r_q, r_k))
        pairs = self.coordinate_pairs
        has_k, scale, zero = inputs.key.has_pos, 1.0 / math.sqrt(q.shape[-1]), r_q.new_zeros(())
        triangle_cols = None if triangle is None else indexed_once(triangle)
        beta_cols = None if beta is None else indexed_once(beta)

        def parabola(score: Tensor, n: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            delta = [k_c[n, j] - q_c[n, i] for q_c, k_c in zip(r_q_cols, r_k_cols, strict=True)]
            total = zero
            if triangle_cols is not None:
                quadratic = (t[n, h, i] * delta[p] * delta[c] for t, (p, c) in zip(triangle_cols, pairs, strict=True))
                total = total + sum(quadratic)
            if beta_cols is not None:
                total = total + sum(b[n, h, i] * d for b, d in zip(beta_cols, delta, strict=True))
            return score + torch.where(has_k[n, j], total * scale, 0.0).to(score.dtype)

        return parabola

    def _projection(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """W_p (H, m, P) in ``dtype``; the identity per head when ``project`` is False (m = P)."""
        if self.w_p is None:
            return torch.eye(self.m, dtype=dtype, device=device).expand(self.num_heads, -1, -1)
        return self.w_p.to(dtype)

    def _key_features(self, s_k: Tensor, square: Tensor | None, inputs: AttentionInputs) -> Tensor:
        """f_k = 1 ⊕ s_k^2 ⊕ s_k (without s_k^2 when the quadratic term is ablated), zero for
        keys without a position; ``square``: s_k^2 when already computed."""
        parts = [torch.ones_like(s_k[..., :1])]
        if self.options.quadratic:
            parts.append(s_k.square() if square is None else square)
        parts.append(s_k)
        return positioned_keys(torch.cat(parts, dim=-1), inputs)

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor | None:
        if self.options.positional_bias_form(q):
            return positional_bias(*self._extra_features(inputs), q, inputs)
        if self.options.form != "explicit":
            return None
        if self.in_position_space(q.device):
            return self._position_space_bias(q, inputs)
        s_q, s_k = self._frame(inputs)
        a, b = self._coefficients_for_queries(inputs, s_q.dtype)
        delta = s_k.unsqueeze(2) - s_q.unsqueeze(3)  # (B, H, Nq, Nk, m): Δr_ij = W_p (r_j - r_i)
        out = torch.zeros(delta.shape[:-1], device=delta.device, dtype=delta.dtype)
        if a is not None:
            out = out + (a.unsqueeze(3) * delta.square()).sum(-1)
        if b is not None:
            out = out + (b.unsqueeze(3) * delta).sum(-1)
        # Eq. 9's bias sits inside S, which Eq. 1 scales by 1/sqrt(h) with q.k.
        return out * inputs.key.has_pos[:, None, None, :] / math.sqrt(q.shape[-1])

    def dense_bias_elements(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> int:
        if self.options.form == "explicit" and self.in_position_space(q.device):
            # the (B, Nq, Nk, T + P) offsets' products, shared by the heads, and the (B, H, Nq, Nk) sum
            per_pair = len(self.coordinate_pairs) + self.pos_dim
            return q.shape[0] * q.shape[-2] * k.shape[-2] * (per_pair + q.shape[1])
        return pape_bias_elements(self.options, q, k, per_pair=self.m)

    def score_mod(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> ScoreMod | None:
        if self.options.form != "explicit":
            return None  # the efficient form has no bias: it runs on SDPA's fused kernels
        if self.in_position_space(q.device):
            return self._position_space_score_mod(q, inputs)
        # Indexed per sample inside the kernel: positions shared by the batch (one sample,
        # first_sample_if_shared) are given every sample's row again, stored by the column
        # copies below (_flex.py's run_flex stores expanded kernel inputs too, a suspected
        # Triton failure otherwise).
        s_q, s_k = (s.expand(q.shape[0], -1, -1, -1) for s in self._frame(inputs))
        a, b = self._coefficients_for_queries(inputs, s_q.dtype)
        has_k, scale, zero = inputs.key.has_pos, 1.0 / math.sqrt(q.shape[-1]), s_q.new_zeros(())
        # One tensor per column, each indexed once (_flex.indexed_once: Inductor's backward
        # takes nothing else); s_k may be s_q itself, so its columns are copies of their own.
        s_q_cols, s_k_cols = indexed_once(s_q), indexed_once(s_k)
        a_cols = None if a is None else indexed_once(a)
        b_cols = None if b is None else indexed_once(b)

        def parabola(score: Tensor, n: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            # The m terms of Eq. 9 unrolled: each reads three scalars, nothing is N x N.
            delta = [s_k_c[n, h, j] - s_q_c[n, h, i] for s_q_c, s_k_c in zip(s_q_cols, s_k_cols, strict=True)]
            total = zero
            if a_cols is not None:
                total = total + sum(a_c[n, h, i] * d.square() for a_c, d in zip(a_cols, delta, strict=True))
            if b_cols is not None:
                total = total + sum(b_c[n, h, i] * d for b_c, d in zip(b_cols, delta, strict=True))
            return score + torch.where(has_k[n, j], total * scale, 0.0).to(score.dtype)

        return parabola


@register("pape")
class ParabolicEncoding(PositionEncoding):
    principles = frozenset(
        {
            Principle.TRANSLATION_INVARIANCE,
            Principle.DISTANCE_DECAY,
            Principle.DIRECTIONALITY,
            Principle.CONTEXT_AWARENESS,
            Principle.FUSED_KERNEL,
        }
    )
    Options = PaPEOptions

    def claimed_principles(self) -> frozenset[Principle]:
        claims = set(self.principles)
        opts = self.options
        dropped = {
            # the bias form hands SDPA an N x N bias in 16 bits, the setting it exists for
            Principle.FUSED_KERNEL: opts.form == "explicit" or opts.low_precision == "bias",
            # W_p with fewer rows than P has a null space: offsets along it leave s, and so the
            # logits, unchanged (conformance measured pape[m=2] on 3-D points: decay -0.49)
            Principle.DISTANCE_DECAY: not (opts.quadratic and opts.softplus)
            or (opts.project and opts.m < self.geometry.pos_dim),
            Principle.DIRECTIONALITY: not opts.linear,
            Principle.CONTEXT_AWARENESS: not opts.context,
        }
        return frozenset(p for p in claims if not dropped.get(p, False))

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return ParabolicLayer(self.dim, self.num_heads, self.geometry.pos_dim, self.options)
