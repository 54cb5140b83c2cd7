"""The principle statistics (PaPE, Section 3), their thresholds and the per-geometry measurement.

All principles are measured on the pre-softmax logits ``L`` (B, H, N, N) of *every*
attention layer of an encoder probe (:mod:`.probes`); the worst layer counts (for the
effects, distance decay, directionality and context awareness: the worst of the layers with
a positional action of their own). The first layer's logits are computed by
:meth:`~pe_bench.harness.blocks.TransformerEncoder.layer_logits`, i.e. on the path the
encoder's forward takes (``prepare`` -> ``embed`` -> zeroed padding -> ``norm1`` ->
``Attention.logits``); a later layer's by that layer's ``Attention.logits`` on the probe
tokens directly (on the prepared layout), i.e. its own positional action. Only the block
of logits between *positioned* tokens enters the statistics: a principle is a statement
about f(r_i, r_j). How position-free tokens (CLS) are treated is checked separately by
the ``cls`` protocol check (:mod:`.protocol`).

Each statistic is computed for every seed in ``SEEDS`` (fresh weights, contents and
transforms per seed) on every probe geometry the encoding supports; the first seed's model
is at initialisation, the others' encoding parameters are randomised
(:func:`~.probes.randomise_encoding`), so that positional paths that are zero at
initialisation are exercised. A principle is *measured* when it holds on every such
geometry (:func:`holds` of the worst geometry).

* translation-invariance: ``L`` with every position shifted by one random t versus ``L``.
  t ~ N(0, 3^2) per axis; for grid-only encodings (``requires_grid``) t is a non-zero
  integer vector in [-3, 3]^P, i.e. a shift of the grid coordinate frame.
  A global shift cannot see an encoding that is absolute in a frame that moves with the
  layout (its centroid), so the statistic also takes an object moved inside a fixed scene
  (:func:`moved_object`): the logits among the object's tokens at two places, every layer.
  Statistic: max |L' - L| / max |L| over the finite entries (inf if the -inf pattern, NaN
  or +inf entries differ), worst of the two probes, layers and seeds. Holds when
  <= ``INVARIANCE_TOL`` (1e-3): float32 rounding of invariant encodings stays below 1e-5,
  a broken invariance is O(0.1).
* rotation-invariance (P >= 2 only; SO(1) is trivial): positions rotated about their
  centroid by a random R in SO(P) (QR of a Gaussian matrix, det fixed to +1). For
  grid-only encodings (only the 2-D grid probe) R is a random non-trivial multiple of 90
  degrees, which maps the square grid onto itself: such encodings are only tested on the
  discrete rotation group of the grid. Same statistic and tolerance as translation.
* distance-decay: all tokens get *identical content* (one random vector per sample, before
  ``embed``), so any variation of ``L`` comes from positions (through q/k transforms,
  biases or absolute embeddings). Statistic: Spearman rank correlation, with average ranks
  for ties, between L_ij and |r_i - r_j| over the finite keys j of each query i (keys an
  encoding masks with -inf are left out), averaged over queries, heads, batch and seeds; a
  flat row (spread <= 1e-5 max |L|) or one with fewer than 3 finite keys counts as 0.
  Holds when <= ``DECAY_THRESHOLD`` (-0.5): most of the ordering of the logits is
  explained by distance.
* directionality: same identical-content logits ``A``; for a pair (i, j), A_ij is offset
  d = r_j - r_i and A_ji is offset -d, at the same distance. Statistic over the pairs
  finite both ways: rms(A - A^T) / rms(A - mean A) per sample and head (0 when A is
  constant up to 1e-5 max |A|; 2, the maximum, when the -inf mask itself is not
  symmetric), averaged over samples, heads and seeds. Holds when > ``EFFECT_TOL`` (1e-3):
  a symmetric encoding gives exactly 0 (float noise ~1e-6), a directional one an
  antisymmetric part comparable with the symmetric one.
* context-awareness: the *positional part* of the logits is
  Pi(x, r) = L(x, r) - L(x, r_bar), where r_bar puts every positioned token at their
  centroid (all relative offsets zero). Pi exists for every family (biases, q/k transforms,
  absolute embeddings). Any positional term that multiplies q and k (RoPE, absolute
  embeddings) changes when q and k change, so "Pi depends on content" would call every
  encoding context-aware, contradicting PaPE's "unlike the baselines, PaPE is context
  aware". We therefore ask whether Pi depends on content *other than the pair's own query
  and key vectors*: the encoding is context-aware when Pi changes under either
    (1) a content perturbation of every token inside the null space of head h's W_q and W_k
        (so every q and k of head h is unchanged; PaPE's a_i = -softplus(W_a x_i) is not),
        scaled to norm sqrt(DIM) per token, for each head h, or
    (2) a perturbation of the content of other tokens: half of the positioned tokens get
        new content and Pi is compared on pairs among the other half (CoPE-style positions
        counted over the context).
  Perturbations are added to the tokens that enter the layer's attention (in layer 0 the
  normalised tokens), to both terms of Pi. Every layer is measured with its own W_q and W_k
  for (1); like PaPE's per-layer W_a, W_b, a layer whose Pi does not depend on content is
  not context-aware, whatever the others do. Statistic: rms(Pi' - Pi) / (rms(Pi) + rms(Pi')
  + 1e-6 rms(L)) over the entries finite in Pi (1 when the -inf pattern moves with
  content), the largest over (1)'s heads and (2), the smallest over the layers, averaged
  over seeds. A later layer whose Pi is zero (max |Pi| <= 1e-5 max |L|, no +-inf: an
  absolute embedding acts at the input only) has no positional action of its own and is
  left out, as for distance decay. Holds when > ``EFFECT_TOL`` (1e-3).
* fused-kernel: two forwards of the whole encoder, once, on the first seed's model: the
  probe's larger layout without padding and its build layout with ``PAD_TOKENS`` padding
  tokens (65, 40, 60 and 29, 19, 23 tokens: no width of the probe, DIM, HEADS, head_dim,
  P, 2 DIM or 3 DIM, so a (.., tokens, features) tensor never looks like a per-pair one).
  They run with ``torch.nn.functional.scaled_dot_product_attention`` wrapped to record
  ``attn_mask`` shapes, every layer's ``bias()`` wrapped to record its result, and a
  ``TorchDispatchMode`` that records, while an attention layer runs (its q/k transform,
  bias, anything else it computes), every operator's output with trailing dims (Nq, Nk) of
  that call, Nq > 1 and Nk > 1: an encoding that builds a per-pair tensor where it returns
  no bias (its own attention weights, say) does not keep the fused kernel's memory.
  SDPA's own work is not recorded (the CPU's math fallback materialises N x N, the CUDA
  kernels do not), nor broadcasts (the (B, 1, 1, Nk) key-padding mask expanded: a zero
  stride). Holds when no layer returns a bias, no mask has shape (..., Nq, Nk) and no
  per-pair tensor is built. Statistic: number of N x N tensors seen (biases, masks and
  per-pair tensors, views counted again).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from pe_bench.adapters.base import EncodingOptions, PositionEncoding, PositionLayout, Principle

from ..blocks import TransformerEncoder
from .probes import (
    BATCH,
    DIM,
    HEADS,
    PAD_TOKENS,
    SEEDS,
    Probe,
    build_model,
    collapse,
    random_rotation,
    random_shift,
    rotate,
    run_safely,
    shift,
    with_padding,
)

INVARIANCE_TOL = 1e-3
EFFECT_TOL = INVARIANCE_TOL
DECAY_THRESHOLD = -0.5

#: The criterion each principle's statistic must meet, in words (shown in reports).
CRITERIA = {
    Principle.TRANSLATION_INVARIANCE: f"max|L(r+t)-L(r)|/max|L| <= {INVARIANCE_TOL:g}",
    Principle.ROTATION_INVARIANCE: f"max|L(Rr)-L(r)|/max|L| <= {INVARIANCE_TOL:g}, P >= 2",
    Principle.DISTANCE_DECAY: f"mean Spearman(logit, distance) <= {DECAY_THRESHOLD:g}",
    Principle.DIRECTIONALITY: f"rms(A-A^T)/rms(A-mean A) > {EFFECT_TOL:g}",
    Principle.CONTEXT_AWARENESS: f"rel. change of positional part > {EFFECT_TOL:g}",
    Principle.FUSED_KERNEL: "no bias, no (.., Nq>1, Nk>1) attn_mask or tensor built in a layer",
}

__all__ = [
    "CRITERIA",
    "DECAY_THRESHOLD",
    "EFFECT_TOL",
    "INVARIANCE_TOL",
    "context_awareness",
    "decay_and_direction",
    "fused_kernel",
    "holds",
    "measure_principles",
    "rotation_invariance",
    "translation_invariance",
    "worst",
]


def holds(p: Principle, value: float) -> bool:
    """Whether a statistic of principle ``p`` meets its criterion."""
    if p in (Principle.TRANSLATION_INVARIANCE, Principle.ROTATION_INVARIANCE):
        return value <= INVARIANCE_TOL
    if p is Principle.DISTANCE_DECAY:
        return value <= DECAY_THRESHOLD
    if p is Principle.FUSED_KERNEL:
        return value == 0
    return value > EFFECT_TOL


def worst(p: Principle, values: Iterable[float]) -> float:
    """The value furthest from holding: the smallest effect, or the largest deviation."""
    values = list(values)
    if p in (Principle.DIRECTIONALITY, Principle.CONTEXT_AWARENESS):
        return min(values)
    return max(values)


# --------------------------------------------------------------------------- helpers


def _pp(logits: Tensor, idx: Tensor) -> Tensor:
    """Block of logits between positioned tokens."""
    return logits[:, :, idx][:, :, :, idx]


def _rms(t: Tensor) -> Tensor:
    return t.double().square().mean().sqrt() if t.numel() else torch.zeros((), dtype=torch.float64)


def _masked_out(t: Tensor) -> Tensor:
    """Entries an encoding masked out with -inf (LookHere's fields of view, causal masks)."""
    return t == float("-inf")


def _rel_max(new: Tensor, ref: Tensor) -> float:
    """max |new - ref| / max |ref| over the finite entries; inf when the -inf pattern
    differs or anything is NaN or +inf."""
    bad = torch.isnan(new) | torch.isnan(ref) | (new == float("inf")) | (ref == float("inf"))
    if bad.any() or not torch.equal(_masked_out(new), _masked_out(ref)):
        return math.inf
    keep = ~_masked_out(ref)
    if not keep.any():
        return 0.0
    scale = ref[keep].abs().max().item()
    diff = (new[keep] - ref[keep]).abs().max().item()
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def _average_ranks(v: Tensor, keep: Tensor) -> Tensor:
    """Ranks along the last dim among the entries where ``keep``, ties sharing their average rank."""
    other = keep.unsqueeze(-2)
    less = ((v.unsqueeze(-1) > v.unsqueeze(-2)) & other).sum(-1).double()
    equal = ((v.unsqueeze(-1) == v.unsqueeze(-2)) & other).sum(-1).double()
    return less + (equal + 1) / 2


def _spearman_rows(values: Tensor, distance: Tensor, flat_tol: float) -> Tensor:
    """Spearman correlation along the last dim over the finite values (keys an encoding
    masks with -inf are left out); rows that are flat or have < 3 finite values count as 0."""
    keep = torch.isfinite(values)
    count = keep.sum(-1, keepdim=True).clamp_min(1)
    safe = torch.where(keep, values, torch.zeros_like(values))
    rv = torch.where(keep, _average_ranks(safe, keep), torch.zeros_like(values))
    rd = torch.where(keep, _average_ranks(distance, keep), torch.zeros_like(values))
    rv = torch.where(keep, rv - rv.sum(-1, keepdim=True) / count, rv)
    rd = torch.where(keep, rd - rd.sum(-1, keepdim=True) / count, rd)
    denom = (rv.square().sum(-1) * rd.square().sum(-1)).sqrt()
    rho = (rv * rd).sum(-1) / denom.clamp_min(1e-300)
    big = torch.finfo(values.dtype).max
    spread = torch.where(keep, values, -big).amax(-1) - torch.where(keep, values, big).amin(-1)
    void = (spread <= flat_tol) | (denom == 0) | (count.squeeze(-1) < 3)
    return torch.where(void, torch.zeros_like(rho), rho)


# --------------------------------------------------------------------------- statistics


def _layers(model: TransformerEncoder) -> range:
    """Every attention layer of the probe: each statistic is the worst over them."""
    return range(len(model.blocks))


def _logits(
    model: TransformerEncoder, x: Tensor, layout: PositionLayout, layer: int, perturbation: Tensor | None = None
) -> Tensor:
    """Layer 0: the logits on the encoder's path (embedding included). A later layer: ``x``
    enters that layer's attention directly, on the prepared layout, so that its own
    positional action is measured (what earlier layers do to position-free tokens is the
    cls check's business, and is already measured at their own layer). ``perturbation`` is
    added to the tokens that enter the layer's attention (after ``norm1`` in layer 0)."""
    if layer == 0:
        return model.layer_logits(x, layout, perturbation=perturbation)
    tokens = x if perturbation is None else x + perturbation
    return model.blocks[layer].attn.logits(tokens, model._input(x, layout)[1])


def translation_invariance(
    model: TransformerEncoder, layout: PositionLayout, idx: Tensor, gen: torch.Generator, grid: bool = False
) -> float:
    """Relative change of the positioned logits under one random translation of every
    position, or of an object moved inside a fixed scene (:func:`moved_object`), whichever
    is larger."""
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    t = random_shift(layout.pos_dim, gen, grid=type(model.encoding).requires_grid)
    moved = shift(layout, t)
    changes = [
        _rel_max(_pp(_logits(model, x, moved, k), idx), _pp(_logits(model, x, layout, k), idx)) for k in _layers(model)
    ]
    return max(*changes, *(moved_object(model, layout, idx, gen, grid, k) for k in _layers(model)))


def moved_object(
    model: TransformerEncoder, layout: PositionLayout, idx: Tensor, gen: torch.Generator, grid: bool, layer: int = 0
) -> float:
    """Logits among the tokens of an object, placed at two places in a fixed scene.

    Every other positioned token holds one background vector. On a grid the object is a
    block of s = (size - 1) // 2 cells per axis in one corner, and its contents move to the
    opposite corner (the layout is unchanged, so an encoding that reads token order moves
    too); on points, a quarter of the tokens keep their contents and move by t ~ N(0, 3^2).
    The pair logits of a pairwise-relative encoding are unchanged; one that is absolute in a
    frame a global shift also moves (the centroid of the layout) is not. Logits that depend
    on other tokens' contents (CoPE, SaPE²: the block's logits change when the background
    tokens get other contents) make the comparison meaningless: such encodings score 0 here and are only
    tested under a global shift. For ``layer`` > 0 the scene is the input of that layer's
    attention itself (the encoder's input path only prepares the positions), so each layer's
    own positional action is tested."""
    n = layout.coords.shape[1]
    coords = layout.coords[0, idx].double()
    b = torch.randn(BATCH, 1, DIM, generator=gen).expand(-1, n, -1).clone()
    if grid:
        lo, size = coords.amin(0), coords.amax(0) - coords.amin(0) + 1
        side = ((size - 1) // 2).clamp_min(1)
        flip = torch.randint(0, 2, (layout.pos_dim,), generator=gen).bool()
        start = torch.where(flip, lo + size - side, lo)
        t = torch.where(flip, -(size - side), size - side)
        inside = ((coords >= start) & (coords < start + side)).all(-1)
        first = idx[inside]
        target = coords[inside] + t
        match = (coords.unsqueeze(0) == target.unsqueeze(1)).all(-1)  # (k, n)
        second = idx[match.float().argmax(-1)]
        moved = layout
    else:
        k = max(2, len(idx) // 4)
        first = second = idx[torch.randperm(len(idx), generator=gen)[:k]]
        t = torch.randn(layout.pos_dim, generator=gen, dtype=torch.float64) * 3.0
        mask = torch.zeros(n, dtype=torch.bool)
        mask[first] = True
        shifted = layout.coords + (t.to(layout.coords.dtype) * mask.unsqueeze(-1).to(layout.coords.dtype))
        moved = layout.with_coords(shifted)
    content = torch.randn(BATCH, len(first), DIM, generator=gen)
    x1, x2 = b.clone(), b.clone()
    x1[:, first], x2[:, second] = content, content

    def block(x: Tensor, lay: PositionLayout, at: Tensor) -> tuple[Tensor, Tensor]:
        """The object's logits with this background, and with other background contents
        (one call on a doubled batch)."""
        other = x.clone()
        inside = set(at.tolist())
        rest = [i for i in range(n) if i not in inside]
        other[:, rest] = torch.randn(BATCH, len(rest), DIM, generator=gen)
        logits = _logits(model, torch.cat([x, other]), _repeated(lay, 2), layer)[:, :, at][:, :, :, at]
        return logits[:BATCH], logits[BATCH:]

    (ref, ref_other), (new, new_other) = block(x1, layout, first), block(x2, moved, second)
    if max(_rel_max(ref_other, ref), _rel_max(new_other, new)) > INVARIANCE_TOL:
        return 0.0  # the object's logits depend on the background: not comparable
    return _rel_max(new, ref)


def rotation_invariance(model: TransformerEncoder, layout: PositionLayout, idx: Tensor, gen: torch.Generator) -> float:
    """Relative change of the positioned logits under one random rotation about the centroid."""
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    rotation = random_rotation(layout.pos_dim, gen, grid=type(model.encoding).requires_grid)
    turned = rotate(layout, rotation)
    return max(
        _rel_max(_pp(_logits(model, x, turned, k), idx), _pp(_logits(model, x, layout, k), idx)) for k in _layers(model)
    )


def decay_and_direction(
    model: TransformerEncoder, layout: PositionLayout, idx: Tensor, gen: torch.Generator
) -> tuple[float, float]:
    """(distance-decay, directionality) statistics of the identical-content logits, the
    worst over the layers with a positional action (the largest correlation, the smallest
    asymmetry)."""
    content = torch.randn(BATCH, 1, DIM, generator=gen).expand(-1, layout.coords.shape[1], -1)
    per_layer = [_decay_and_direction(_logits(model, content, layout, k), layout, idx) for k in _layers(model)]
    # A later layer whose identical-content logits are flat has no positional action of its
    # own (an absolute embedding acts at the input only): it is left out.
    acting = [stats for k, (*stats, flat) in enumerate(per_layer) if k == 0 or not flat]
    return max(rho for rho, _ in acting), min(ratio for _, ratio in acting)


def _decay_and_direction(logits: Tensor, layout: PositionLayout, idx: Tensor) -> tuple[float, float, bool]:
    a = _pp(logits, idx).double()  # (B, H, n, n)
    coords = layout.coords[:, idx].double()
    dist2 = (coords.unsqueeze(2) - coords.unsqueeze(1)).square().sum(-1)  # (B, n, n), exact ties on grids
    if torch.isnan(a).any() or (a == float("inf")).any():
        raise FloatingPointError("NaN or +inf in the logits")
    finite = torch.isfinite(a)
    scale = a[finite].abs().max().item() if finite.any() else 0.0
    rho = _spearman_rows(a, dist2.unsqueeze(1).expand_as(a), 1e-5 * scale).mean().item()
    # Directionality on the pairs finite both ways; a -inf mask that differs between
    # (i, j) and (j, i) is directional by itself and scores the maximum, 2.
    both = finite & finite.transpose(-1, -2)
    count = both.sum(dim=(-1, -2)).clamp_min(1)
    a0 = torch.where(both, a, torch.zeros_like(a))
    mean = a0.sum(dim=(-1, -2), keepdim=True) / count[..., None, None]
    spread = (torch.where(both, a0 - mean, torch.zeros_like(a)).square().sum(dim=(-1, -2)) / count).sqrt()
    asym = ((a0 - a0.transpose(-1, -2)).square().sum(dim=(-1, -2)) / count).sqrt()
    ratio = torch.where(spread > 1e-5 * max(scale, 1e-30), asym / spread.clamp_min(1e-300), torch.zeros_like(asym))
    mask_asym = (finite != finite.transpose(-1, -2)).any(-1).any(-1)
    ratio = torch.where(mask_asym, torch.full_like(ratio, 2.0), ratio)
    big = torch.finfo(a.dtype).max
    spread_all = torch.where(finite, a, -big).amax((-1, -2)) - torch.where(finite, a, big).amin((-1, -2))
    flat = bool((spread_all <= 1e-5 * scale).all()) if finite.any() else True  # constant per sample and head
    return rho, ratio.mean().item(), flat


def _repeated(layout: PositionLayout, times: int) -> PositionLayout:
    """``layout`` for a batch of ``times`` copies of its samples (one call for several inputs)."""
    return PositionLayout(
        coords=layout.coords.repeat(times, 1, 1),
        has_pos=layout.has_pos.repeat(times, 1),
        valid=None if layout.valid is None else layout.valid.repeat(times, 1),
        grid_shape=layout.grid_shape,
    )


def _positional_parts(
    model: TransformerEncoder, x: Tensor, layout: PositionLayout, layer: int, deltas: list[Tensor]
) -> list[tuple[Tensor, Tensor]]:
    """(Pi, L) of ``layer`` for each of ``deltas``: Pi = L(x, r) - L(x, r_bar), the delta added
    to the tokens that enter its attention in both terms; all in one call per term."""
    times = len(deltas)
    xs, delta = x.repeat(times, 1, 1), torch.cat(deltas)
    logits = _logits(model, xs, _repeated(layout, times), layer, delta)
    pis = logits - _logits(model, xs, _repeated(collapse(layout), times), layer, delta)
    return list(zip(pis.split(x.shape[0]), logits.split(x.shape[0]), strict=True))


def _change(new: Tensor, old: Tensor, ref: Tensor) -> float:
    """rms(new - old) / (rms(old) + rms(new) + 1e-6 rms(ref)) of two positional parts."""
    # -inf - -inf is NaN in Pi: compare where both are finite; a -inf pattern that moves
    # with content is a content-dependent positional term (score 1).
    if not torch.equal(torch.isfinite(new), torch.isfinite(old)):
        return 1.0
    keep = torch.isfinite(old)
    new, old = new[keep], old[keep]
    denom = _rms(old) + _rms(new) + 1e-6 * _rms(ref[torch.isfinite(ref)]) + 1e-30
    return (_rms(new - old) / denom).item() if keep.any() else 0.0


def _has_positional_action(pi: Tensor, logits: Tensor) -> bool:
    """Whether a positional part is not zero (up to 1e-5 max |L|): +-inf in Pi is a -inf
    mask that moves with positions (NaN, -inf at both positions, is not)."""
    if torch.isinf(pi).any():
        return True
    finite, ref = torch.isfinite(pi), logits[torch.isfinite(logits)]
    scale = ref.abs().max().item() if ref.numel() else 0.0
    return bool(finite.any()) and pi[finite].abs().max().item() > 1e-5 * scale


def _head_null_space(weight: Tensor, head: int) -> Tensor:
    """An orthonormal basis (rows) of the null space of head ``head``'s rows of W_q and W_k
    in a qkv projection weight (3 DIM, DIM)."""
    hd = DIM // HEADS
    rows = torch.cat([weight[head * hd : (head + 1) * hd], weight[DIM + head * hd : DIM + (head + 1) * hd]])
    _, s, vh = torch.linalg.svd(rows.detach().double())
    return vh[int((s > s.max() * 1e-10).sum()) :]


def context_awareness(model: TransformerEncoder, layout: PositionLayout, idx: Tensor, gen: torch.Generator) -> float:
    """Relative change of the positional part Pi under content that leaves the pair's own q
    and k unchanged (per head) or that belongs to other tokens, the largest of those
    perturbations; the smallest over the layers with a positional action of their own."""
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    per_layer = [_layer_context_awareness(model, x, layout, idx, gen, k) for k in _layers(model)]
    # A later layer whose positional part is zero has no positional action of its own (an
    # absolute embedding acts at the input only), so nothing there to adapt to content: it
    # is left out, as in decay_and_direction.
    return min(ratio for k, (ratio, acts) in enumerate(per_layer) if k == 0 or acts)


def _layer_context_awareness(
    model: TransformerEncoder, x: Tensor, layout: PositionLayout, idx: Tensor, gen: torch.Generator, layer: int
) -> tuple[float, bool]:
    """(largest relative change of layer ``layer``'s Pi over the perturbations, whether its
    Pi is non-zero at all); the null spaces are those of that layer's own W_q and W_k."""
    n = layout.coords.shape[1]
    # The perturbations, and which block of Pi each is compared on (pairs, head).
    deltas, blocks = [torch.zeros_like(x)], []
    for h in range(HEADS):
        null = _head_null_space(model.blocks[layer].attn.qkv.weight, h)
        if null.shape[0] == 0:
            continue
        noise = torch.randn(BATCH, n, DIM, generator=gen, dtype=torch.float64)
        delta = noise @ null.T @ null
        deltas.append((delta * (math.sqrt(DIM) / delta.norm(dim=-1, keepdim=True).clamp_min(1e-12))).float())
        blocks.append((idx, h))
    order = idx[torch.randperm(len(idx), generator=gen)]
    changed, kept = order[: len(idx) // 2], order[len(idx) // 2 :]
    if len(kept) >= 2:
        delta = torch.zeros(BATCH, n, DIM)
        delta[:, changed] = torch.randn(BATCH, len(changed), DIM, generator=gen)
        deltas.append(delta)
        blocks.append((kept, slice(None)))
    (base, logits), *perturbed = _positional_parts(model, x, layout, layer, deltas)
    ratios = [
        _change(_pp(new, rows)[:, head], _pp(base, rows)[:, head], _pp(logits, rows)[:, head])
        for (new, _), (rows, head) in zip(perturbed, blocks, strict=True)
    ]
    return max([0.0, *ratios]), _has_positional_action(_pp(base, idx), _pp(logits, idx))


@dataclass
class _Spy:
    """What a spied forward saw: SDPA's ``attn_mask`` shapes, every ``bias()`` result's shape,
    and the per-pair tensors the attention layers built ("operator (shape)")."""

    masks: list[tuple[int, ...] | None] = field(default_factory=list)
    biases: list[tuple[int, ...] | None] = field(default_factory=list)
    pairs: list[str] = field(default_factory=list)


class _PairTensors(TorchDispatchMode):
    """Records every tensor an operator returns whose trailing dims are the (Nq, Nk) of the
    attention call in progress (``pair``; None: nothing is recorded).

    A broadcast (a zero stride in those dims, as the (B, 1, 1, Nk) key-padding mask expanded)
    holds no Nq x Nk memory and is left out; a view of a per-pair tensor is counted again."""

    def __init__(self, found: list[str]) -> None:
        super().__init__()
        self.found = found
        self.pair: tuple[int, int] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.pair is not None:
            for t in pytree.tree_leaves(out):
                if self._per_pair(t):
                    self.found.append(f"{func.overloadpacket.__name__} {tuple(t.shape)}")
        return out

    def _per_pair(self, t: Any) -> bool:
        if not isinstance(t, Tensor) or t.layout != torch.strided or t.dim() < 2:
            return False
        return t.shape[-2:] == self.pair and 0 not in t.stride()[-2:]

    @contextlib.contextmanager
    def recording(self, pair: tuple[int, int] | None) -> Iterator[None]:
        previous, self.pair = self.pair, pair
        try:
            yield
        finally:
            self.pair = previous


def _run_spied(model: TransformerEncoder, runs: Iterable[tuple[Tensor, PositionLayout]]) -> _Spy:
    spy = _Spy()
    pairs = _PairTensors(spy.pairs)
    original_sdpa = F.scaled_dot_product_attention

    def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, *args, **kwargs):
        spy.masks.append(None if attn_mask is None else tuple(attn_mask.shape))
        # What the kernel computes inside is the kernel's business (CPU's math fallback
        # materialises Nq x Nk, CUDA's fused kernels do not): only its inputs are judged.
        with pairs.recording(None):
            return original_sdpa(query, key, value, attn_mask, *args, **kwargs)

    def recorded_bias(method: Callable[..., Tensor | None]) -> Callable[..., Tensor | None]:
        def bias(*args, **kwargs):
            out = method(*args, **kwargs)
            spy.biases.append(None if out is None else tuple(out.shape))
            return out

        return bias

    def recorded_pairs(forward: Callable[..., Tensor]) -> Callable[..., Tensor]:
        def attend(x: Tensor, query: PositionLayout, context: Tensor | None = None, *args, **kwargs) -> Tensor:
            n_q, n_k = x.shape[1], (x if context is None else context).shape[1]
            with pairs.recording((n_q, n_k) if n_q > 1 and n_k > 1 else None):
                return forward(x, query, context, *args, **kwargs)

        return attend

    layers = {id(b.attn.encoding): b.attn.encoding for b in model.blocks if b.attn.encoding is not None}
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", sdpa))
        for layer in layers.values():
            stack.enter_context(mock.patch.object(layer, "bias", recorded_bias(layer.bias)))
        for block in model.blocks:
            stack.enter_context(mock.patch.object(block.attn, "forward", recorded_pairs(block.attn.forward)))
        stack.enter_context(torch.no_grad())
        stack.enter_context(pairs)
        for x, layout in runs:
            model(x, layout)
    return spy


def _fused_kernel_runs(probe: Probe, gen: torch.Generator) -> list[tuple[Tensor, PositionLayout]]:
    """(tokens, layout) of the fused-kernel forwards: the larger layout without padding and
    the build layout with ``PAD_TOKENS`` padding tokens, 65, 40, 60 and 29, 19, 23 tokens:
    never a width of the probe (DIM, HEADS, head_dim, P, the MLP's and qkv's), so that a
    tensor of tokens x features cannot pass for a per-pair one (the build sizes 16 = head_dim
    would)."""
    larger, build = probe.larger_layout(BATCH, gen), probe.layout(BATCH, gen)
    x = torch.randn(BATCH, larger.coords.shape[1], DIM, generator=gen)
    padded, xp = with_padding(build, torch.randn(BATCH, build.coords.shape[1], DIM, generator=gen), PAD_TOKENS, gen)
    return [(x, larger), (xp, padded)]


def fused_kernel(model: TransformerEncoder, probe: Probe, gen: torch.Generator) -> tuple[float, str]:
    """(number of Nq x Nk tensors seen in a forward with and without padding: biases, masks
    and per-pair tensors the attention layers built, note)."""
    spy = _run_spied(model, _fused_kernel_runs(probe, gen))
    square = [m for m in spy.masks if m is not None and len(m) >= 2 and m[-1] > 1 and m[-2] > 1]
    biases = [b for b in spy.biases if b is not None]
    notes = []
    if biases:
        notes.append(f"bias() returned {biases[0]}")
    if square:
        notes.append(f"attn_mask {square[0]}")
    if spy.pairs:
        notes.append(f"{len(spy.pairs)} per-pair tensors built in the layers, the first by {spy.pairs[0]}")
    if not notes:
        masks = sorted({str(m) for m in spy.masks})
        notes.append(f"attn_mask shapes {', '.join(masks)}")
    return float(len(square) + len(biases) + len(spy.pairs)), "; ".join(notes)


# --------------------------------------------------------------------------- one geometry


def measure_principles(
    cls: type[PositionEncoding],
    probe: Probe,
    options: Mapping[str, Any] | EncodingOptions | None,
    seeds: tuple[int, ...],
) -> tuple[dict[Principle, tuple[float | None, str]], TransformerEncoder]:
    """Per-principle (statistic, note) on one geometry, and the model the fused-kernel
    statistic ran on (the first seed's), which the protocol checks then use.

    The statistic is None (and the note the error) when its measurement crashed; a
    principle that is not measurable here (rotation for P = 1) is left out.
    """
    stats: dict[Principle, list[float]] = {p: [] for p in Principle}
    errors: dict[Principle, str] = {}
    fused_note = ""
    for n, seed in enumerate(seeds):
        # The first seed at initialisation, the others with randomised encoding parameters.
        model = build_model(cls, probe, options, seed, randomise=n > 0)
        gen = torch.Generator().manual_seed(1000 + seed)
        layout = probe.layout(BATCH, gen)
        idx = layout.has_pos[0].nonzero().squeeze(-1)
        with torch.no_grad():
            tasks: list[tuple[Principle, Callable[[], Any]]] = [
                (
                    Principle.TRANSLATION_INVARIANCE,
                    partial(translation_invariance, model, layout, idx, gen, probe.grid is not None),
                ),
                (Principle.DISTANCE_DECAY, partial(decay_and_direction, model, layout, idx, gen)),
                (Principle.CONTEXT_AWARENESS, partial(context_awareness, model, layout, idx, gen)),
            ]
            if probe.geometry.pos_dim >= 2:
                tasks.append((Principle.ROTATION_INVARIANCE, partial(rotation_invariance, model, layout, idx, gen)))
            for principle, fn in tasks:
                value, err = run_safely(fn)
                if err:
                    errors.setdefault(principle, err)
                    if principle is Principle.DISTANCE_DECAY:
                        errors.setdefault(Principle.DIRECTIONALITY, err)
                elif principle is Principle.DISTANCE_DECAY:
                    stats[Principle.DISTANCE_DECAY].append(value[0])
                    stats[Principle.DIRECTIONALITY].append(value[1])
                else:
                    stats[principle].append(value)
    # The fused-kernel statistic and the protocol checks run on the first seed's model
    # with randomised encoding parameters.
    model = build_model(cls, probe, options, seeds[0] if seeds else SEEDS[0], randomise=True)
    value, err = run_safely(lambda: fused_kernel(model, probe, torch.Generator().manual_seed(2024)))
    if err:
        errors[Principle.FUSED_KERNEL] = err
    else:
        stats[Principle.FUSED_KERNEL].append(value[0])
        fused_note = value[1]

    result: dict[Principle, tuple[float | None, str]] = {}
    for p in Principle:
        if p in errors:
            result[p] = (None, f"{probe.key}: {errors[p]}")
        elif not stats[p]:
            continue  # not measurable here (rotation for P = 1)
        elif p in (Principle.TRANSLATION_INVARIANCE, Principle.ROTATION_INVARIANCE, Principle.FUSED_KERNEL):
            result[p] = (max(stats[p]), fused_note if p is Principle.FUSED_KERNEL else "")
        else:
            result[p] = (sum(stats[p]) / len(stats[p]), "")
    return result, model
