"""Conformance suite: measure every principle an encoding claims, and check the protocol.

Everything here runs on small random models (dim 64, 4 heads of 16 channels, depth 2) on CPU,
for every *probe geometry* the encoding supports:

* ``grid2d+cls``: a 5 x 5 grid of patches (P = 2) after one CLS token;
* ``seq1d``:      a 16-token sequence (P = 1, described as a 1-D grid of 16 cells);
* ``points3d``:   20 irregular points in a 4 x 4 x 4 m box (P = 3, no grid).

Each measurement is repeated for several seeds (fresh weights, contents and transforms per
seed; ``SEEDS``). A principle is *measured* when it holds on every supported geometry.

Principles (PaPE Section 3)
---------------------------
All principles are measured on the pre-softmax logits ``L`` (B, H, N, N) of the *first*
attention layer, computed exactly as :class:`~pe_bench.harness.blocks.TransformerEncoder`
feeds that layer (``prepare`` -> ``embed`` -> zeroed padding -> ``norm1`` -> ``Attention.logits``),
with the model in eval mode (so training-only augmentation such as CAPE's is off).
Only the block of logits between *positioned* tokens enters the principle statistics: a
principle is a statement about f(r_i, r_j). How position-free tokens (CLS) are treated is
checked separately by the ``cls`` protocol check below.

* translation-invariance: ``L`` with every position shifted by one random t versus ``L``.
  t ~ N(0, 3^2) per axis; for grid-only encodings (``requires_grid``) t is a non-zero
  integer vector in [-3, 3]^P, i.e. a shift of the grid coordinate frame.
  Statistic: max |L' - L| / max |L| (worst seed). Holds when <= ``INVARIANCE_TOL`` (1e-3):
  float32 rounding of invariant encodings stays below 1e-5, a broken invariance is O(0.1).
* rotation-invariance (P >= 2 only; SO(1) is trivial): positions rotated about their
  centroid by a random R in SO(P) (QR of a Gaussian matrix, det fixed to +1). For
  grid-only encodings R is a random non-trivial multiple of 90 degrees, about the grid
  centre, which maps the (square) grid onto itself: such encodings are only tested on the
  discrete rotation group of the grid. Same statistic and tolerance as translation.
* distance-decay: all tokens get *identical content* (one random vector per sample, before
  ``embed``), so any variation of ``L`` comes from positions (through q/k transforms,
  biases or absolute embeddings). Statistic: Spearman rank correlation, with average ranks
  for ties, between L_ij and |r_i - r_j| over the keys j of each query i, averaged over
  queries, heads, batch and seeds (a constant row counts as 0). Holds when
  <= ``DECAY_THRESHOLD`` (-0.5): most of the ordering of the logits is explained by distance.
* directionality: same identical-content logits ``A``; for a pair (i, j), A_ij is offset
  d = r_j - r_i and A_ji is offset -d, at the same distance. Statistic:
  rms(A - A^T) / rms(A - mean A) per sample and head (0 when A is constant), averaged.
  Holds when > ``EFFECT_TOL`` (1e-2): a symmetric encoding gives exactly 0 (float noise
  ~1e-6), a directional one an antisymmetric part comparable with the symmetric one.
* context-awareness: the *positional part* of the logits is
  Pi(x, r) = L(x, r) - L(x, r_bar), where r_bar puts every positioned token at their
  centroid (all relative offsets zero). Pi exists for every family (biases, q/k transforms,
  absolute embeddings). Any positional term that multiplies q and k (RoPE, absolute
  embeddings) changes when q and k change, so "Pi depends on content" would call every
  encoding context-aware, contradicting PaPE's "unlike the baselines, PaPE is context
  aware". We therefore ask whether Pi depends on content *other than the pair's own query
  and key vectors*: the encoding is context-aware when Pi changes under either
    (1) a content perturbation of every token inside the null space of head h's W_q and W_k
        (so every q and k of head h is unchanged; PaPE's a_i = -softplus(W_a x_i) is not), or
    (2) a perturbation of the content of other tokens: half of the positioned tokens get
        new content and Pi is compared on pairs among the other half (CoPE-style positions
        counted over the context).
  Perturbations are added to the normalised tokens that enter the layer, to both terms of
  Pi. Statistic: rms(Pi' - Pi) / (rms(Pi) + rms(Pi') + 1e-6 rms(L)), the larger of (1) and
  (2), averaged over seeds. Holds when > ``EFFECT_TOL`` (1e-2).
* fused-kernel: a forward of the whole encoder (with and without key padding) runs with
  ``torch.nn.functional.scaled_dot_product_attention`` wrapped to record ``attn_mask``
  shapes, and every layer's ``bias()`` wrapped to record its result. Holds when no layer
  returns a bias and no mask has shape (..., Nq, Nk) with Nq > 1 and Nk > 1 (a
  (B, 1, 1, Nk) key-padding mask is fine). Statistic: number of N x N tensors seen.

Protocol checks (all must pass)
-------------------------------
Outputs are compared with max |a - b| <= ``PROTOCOL_TOL`` (1e-4) * max(1, max |b|).

* padding: 3 padding tokens (valid False, content ~ N(0, 10^2), positions ~ N(0, 50^2),
  has_pos True) appended after the real tokens (after the grid on grid geometries, with
  the layout's grid_shape unchanged); the real tokens' outputs of a depth-2 encoder in
  eval mode must equal those without padding. (Non-finite garbage is not tested: the
  encoder zeroes padding by multiplication, which keeps NaN.)
* cls (geometries with prefix tokens), a prefix token's own positional contribution is nil:
    (a) its coordinate entries are ignored: garbage coordinates for the CLS change no output;
    (b) ``embed`` gives it nothing positional: permuting the patch positions leaves the
        embedded CLS token unchanged;
    (c) for encodings measured translation-invariant on this geometry, shifting all patch
        positions leaves every output, the CLS output included, unchanged. An encoding
        that is relative between patches but treats the CLS as sitting at some position
        (e.g. an identity rotation, which *is* position 0) fails here.
* gradients: in train mode with padding, a random linear loss of the encoder output gives
  every parameter of the encoding (model level and per layer) a gradient that is not
  None, finite and not identically zero.
* extrapolation: a larger grid (8 x 8; 40 tokens) or more, more spread points (60 in an
  8 m box) than the encoding was built for: no exception, finite output of the right shape.
* cross-attention: ``Attention(..., cross=True)`` with the first layer's encoding, queries
  (3 x 3 grid + CLS; 7 tokens; 9 points) fewer than keys: finite output of shape
  (B, Nq, D) and logits (B, H, Nq, Nk); padding the keys changes no query output; and
  cross-attention of a sequence onto itself (a copy of its layout, not the same object)
  with the self-attention weights reproduces self-attention.

API: :func:`measure` (or :func:`check`) -> :class:`Report`; :func:`principles_table`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from unittest import mock

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from pe_bench.adapters import registry
from pe_bench.adapters.base import (
    EncodingOptions,
    Geometry,
    NotApplicableError,
    PositionEncoding,
    PositionLayout,
    Principle,
    masked_mean,
)

from ..attention import Attention
from ..blocks import TransformerEncoder

DIM = 64
HEADS = 4
DEPTH = 2
BATCH = 2
SEEDS = (0, 1, 2)

INVARIANCE_TOL = 1e-3
EFFECT_TOL = INVARIANCE_TOL
DECAY_THRESHOLD = -0.5
PROTOCOL_TOL = 1e-4

PAD_TOKENS = 3

__all__ = [
    "CheckResult",
    "PrincipleResult",
    "Probe",
    "PROBES",
    "Report",
    "check",
    "clear_cache",
    "measure",
    "principles_table",
]


# --------------------------------------------------------------------------- geometries


@dataclass(frozen=True)
class Probe:
    """One probe geometry: how to lay out tokens at build size, larger, and as queries."""

    key: str
    geometry: Geometry
    description: str
    grid: tuple[int, ...] | None = None
    larger_grid: tuple[int, ...] | None = None
    query_grid: tuple[int, ...] | None = None
    points: int = 0
    larger_points: int = 0
    query_points: int = 0
    extent: float = 4.0

    def _grid(self, batch: int, grid: tuple[int, ...]) -> PositionLayout:
        layout = PositionLayout.grid(batch, grid, self.geometry.num_prefix_tokens)
        return layout.with_coords(layout.coords.contiguous())

    def _points(self, batch: int, n: int, extent: float, gen: torch.Generator) -> PositionLayout:
        coords = torch.rand(batch, n, self.geometry.pos_dim, generator=gen) * extent
        return PositionLayout(coords=coords, has_pos=torch.ones(batch, n, dtype=torch.bool))

    def layout(self, batch: int, gen: torch.Generator) -> PositionLayout:
        if self.grid is not None:
            return self._grid(batch, self.grid)
        return self._points(batch, self.points, self.extent, gen)

    def larger_layout(self, batch: int, gen: torch.Generator) -> PositionLayout:
        if self.larger_grid is not None:
            return self._grid(batch, self.larger_grid)
        return self._points(batch, self.larger_points, 2 * self.extent, gen)

    def query_layout(self, batch: int, gen: torch.Generator) -> PositionLayout:
        if self.query_grid is not None:
            return self._grid(batch, self.query_grid)
        return self._points(batch, self.query_points, self.extent, gen)


PROBES: tuple[Probe, ...] = (
    Probe(
        "grid2d+cls",
        Geometry(pos_dim=2, grid_shape=(5, 5), units="patch", num_prefix_tokens=1),
        "P=2, 5x5 grid after 1 CLS token",
        grid=(5, 5),
        larger_grid=(8, 8),
        query_grid=(3, 3),
    ),
    Probe(
        "seq1d",
        Geometry(pos_dim=1, grid_shape=(16,), units="token"),
        "P=1, 16-token sequence",
        grid=(16,),
        larger_grid=(40,),
        query_grid=(7,),
    ),
    Probe(
        "points3d",
        Geometry(pos_dim=3, grid_shape=None, units="m"),
        "P=3, 20 irregular points",
        points=20,
        larger_points=60,
        query_points=9,
    ),
)


# --------------------------------------------------------------------------- results


@dataclass
class PrincipleResult:
    """Declared versus measured for one principle; ``measured`` None = not measurable here."""

    principle: Principle
    declared: bool
    measured: bool | None
    statistic: float | None
    per_geometry: dict[str, float] = field(default_factory=dict)
    criterion: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        """A claim must be measured; an unclaimed principle may or may not hold."""
        return not self.declared or self.measured is True

    @property
    def cell(self) -> str:
        mark = {True: "✓", False: "✗"}
        if self.measured is None:
            return "claimed ✓ (n/a)" if self.declared else "n/a"
        if self.declared == self.measured:
            return mark[self.measured]
        return f"claimed {mark[self.declared]} (measured {mark[self.measured]})"


@dataclass
class CheckResult:
    name: str
    geometry: str
    passed: bool
    message: str


@dataclass
class Report:
    encoding: str
    options: dict[str, Any]
    geometries: list[str] = field(default_factory=list)
    not_applicable: dict[str, str] = field(default_factory=dict)
    principles: dict[Principle, PrincipleResult] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def applicable(self) -> bool:
        return bool(self.geometries)

    def principle_failures(self) -> list[str]:
        out = []
        for r in self.principles.values():
            if not r.ok:
                what = "cannot be measured on any supported geometry" if r.measured is None else "is not measured"
                out.append(f"{r.principle.value}: claimed but {what} ({_stat_text(r)}; needs {r.criterion})")
        return out

    def check_failures(self) -> list[str]:
        return [f"{c.name} @ {c.geometry}: {c.message}" for c in self.checks if not c.passed]

    def failures(self) -> list[str]:
        return self.principle_failures() + self.check_failures()

    @property
    def passed(self) -> bool:
        return not self.failures()

    def cells(self) -> dict[str, str]:
        if not self.applicable:
            return {p.value: "n/a" for p in Principle}
        return {p.value: self.principles[p].cell for p in Principle}

    def format(self) -> str:
        opts = f" {json.dumps(self.options, sort_keys=True, default=str)}" if self.options else ""
        verdict = "PASS" if self.passed else "FAIL"
        lines = [f"Conformance of {self.encoding!r}{opts}: {verdict} ({self.seconds:.1f} s)"]
        for probe in PROBES:
            if probe.key in self.geometries:
                lines.append(f"  geometry {probe.key}: {probe.description}")
            elif probe.key in self.not_applicable:
                lines.append(f"  geometry {probe.key}: n/a ({self.not_applicable[probe.key]})")
        if not self.applicable:
            return "\n".join(lines)
        lines.append("")
        lines.append(f"  {'principle':<24}{'claimed':<9}{'measured':<10}{'ok':<4}statistic (criterion)")
        for r in self.principles.values():
            claimed = "yes" if r.declared else "no"
            measured = "n/a" if r.measured is None else ("yes" if r.measured else "no")
            ok = "ok" if r.ok else "FAIL"
            per = ", ".join(f"{k} {v:.3g}" for k, v in r.per_geometry.items())
            detail = f"{_stat_text(r)} [{per}] ({r.criterion})" if per else f"n/a ({r.criterion})"
            lines.append(f"  {r.principle.value:<24}{claimed:<9}{measured:<10}{ok:<4}{detail}")
            if r.note:
                lines.append(f"  {'':<47}{r.note}")
        lines.append("")
        lines.append("  protocol checks:")
        for c in self.checks:
            lines.append(f"    [{'pass' if c.passed else 'FAIL'}] {c.name} @ {c.geometry}: {c.message}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _stat_text(r: PrincipleResult) -> str:
    return "no statistic" if r.statistic is None else f"statistic {r.statistic:.3g}"


_CRITERIA = {
    Principle.TRANSLATION_INVARIANCE: f"max|L(r+t)-L(r)|/max|L| <= {INVARIANCE_TOL:g}",
    Principle.ROTATION_INVARIANCE: f"max|L(Rr)-L(r)|/max|L| <= {INVARIANCE_TOL:g}, P >= 2",
    Principle.DISTANCE_DECAY: f"mean Spearman(logit, distance) <= {DECAY_THRESHOLD:g}",
    Principle.DIRECTIONALITY: f"rms(A-A^T)/rms(A-mean A) > {EFFECT_TOL:g}",
    Principle.CONTEXT_AWARENESS: f"rel. change of positional part > {EFFECT_TOL:g}",
    Principle.FUSED_KERNEL: "no bias and no (.., Nq>1, Nk>1) attn_mask",
}


# --------------------------------------------------------------------------- helpers


def _options_key(options: Mapping[str, Any] | EncodingOptions | None) -> tuple[dict[str, Any], str]:
    data = options.model_dump() if isinstance(options, EncodingOptions) else dict(options or {})
    return data, json.dumps(data, sort_keys=True, default=str)


def _build(
    cls: type[PositionEncoding], probe: Probe, options: Mapping[str, Any] | EncodingOptions | None, seed: int
) -> TransformerEncoder:
    torch.manual_seed(seed)
    if not isinstance(options, EncodingOptions):
        options = cls.Options(**dict(options or {}))
    encoding = cls(geometry=probe.geometry, dim=DIM, num_heads=HEADS, depth=DEPTH, options=options)
    model = TransformerEncoder(DIM, DEPTH, HEADS, encoding, mlp_ratio=2.0)
    return model.eval()


def _first_logits(model: TransformerEncoder, x: Tensor, layout: PositionLayout, delta: Tensor | None = None) -> Tensor:
    """Logits of the first attention layer as the encoder computes them; ``delta`` is added
    to the normalised tokens that enter the layer."""
    enc = model.encoding
    prepared = enc.prepare(layout)
    h = enc.embed(x, prepared)
    if prepared.valid is not None:
        h = h * prepared.valid.unsqueeze(-1).to(h.dtype)
    block = model.blocks[0]
    h = block.norm1(h)
    if delta is not None:
        h = h + delta
    return block.attn.logits(h, prepared)


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


def _close(new: Tensor, ref: Tensor) -> tuple[bool, float]:
    if new.shape != ref.shape:
        return False, math.inf
    diff = (new - ref).abs().max().item() if new.numel() else 0.0
    bound = PROTOCOL_TOL * max(1.0, ref.abs().max().item() if ref.numel() else 1.0)
    return bool(math.isfinite(diff) and diff <= bound), diff


def _shift(layout: PositionLayout, t: Tensor) -> PositionLayout:
    mask = layout.has_pos.unsqueeze(-1).to(layout.coords.dtype)
    return layout.with_coords(layout.coords + t.to(layout.coords.dtype) * mask)


def _rotate(layout: PositionLayout, rotation: Tensor) -> PositionLayout:
    centre = masked_mean(layout.coords, layout.positioned)
    rotated = centre + (layout.coords - centre) @ rotation.T.to(layout.coords.dtype)
    return layout.with_coords(torch.where(layout.has_pos.unsqueeze(-1), rotated, layout.coords))


def _collapse(layout: PositionLayout) -> PositionLayout:
    """Every positioned token at the centroid: all relative offsets zero."""
    centre = masked_mean(layout.coords, layout.positioned).expand_as(layout.coords)
    return layout.with_coords(torch.where(layout.has_pos.unsqueeze(-1), centre, layout.coords))


def _random_shift(pos_dim: int, grid_only: bool, gen: torch.Generator) -> Tensor:
    if grid_only:
        t = torch.randint(-3, 4, (pos_dim,), generator=gen).float()
        if not t.any():
            t[0] = 2.0
        return t
    return torch.randn(pos_dim, generator=gen) * 3.0


def _random_rotation(pos_dim: int, grid_only: bool, gen: torch.Generator) -> Tensor:
    if grid_only:
        quarter = torch.tensor([[0.0, -1.0], [1.0, 0.0]])
        k = int(torch.randint(1, 4, (1,), generator=gen))
        return torch.linalg.matrix_power(quarter, k)
    q, r = torch.linalg.qr(torch.randn(pos_dim, pos_dim, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q.float()


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


def _padded(layout: PositionLayout, x: Tensor, gen: torch.Generator) -> tuple[PositionLayout, Tensor]:
    b, n, p = layout.coords.shape
    coords = torch.cat([layout.coords, torch.randn(b, PAD_TOKENS, p, generator=gen) * 50.0], dim=1)
    has_pos = torch.cat([layout.has_pos, torch.ones(b, PAD_TOKENS, dtype=torch.bool)], dim=1)
    valid = torch.cat([torch.ones(b, n, dtype=torch.bool), torch.zeros(b, PAD_TOKENS, dtype=torch.bool)], dim=1)
    garbage = torch.randn(b, PAD_TOKENS, x.shape[-1], generator=gen) * 10.0
    padded = PositionLayout(coords=coords, has_pos=has_pos, valid=valid, grid_shape=layout.grid_shape)
    return padded, torch.cat([x, garbage], dim=1)


def _copy_layout(layout: PositionLayout) -> PositionLayout:
    return PositionLayout(
        coords=layout.coords.clone(),
        has_pos=layout.has_pos.clone(),
        valid=None if layout.valid is None else layout.valid.clone(),
        grid_shape=layout.grid_shape,
    )


def _encoding_parameters(model: TransformerEncoder) -> dict[str, torch.nn.Parameter]:
    params: dict[int, tuple[str, torch.nn.Parameter]] = {}
    for name, p in model.encoding.named_parameters():
        params.setdefault(id(p), (f"encoding.{name}", p))
    for i, block in enumerate(model.blocks):
        layer = block.attn.encoding
        if layer is not None:
            for name, p in layer.named_parameters():
                params.setdefault(id(p), (f"layer{i}.{name}", p))
    return dict(params.values())


# --------------------------------------------------------------------------- principles


@dataclass
class _Context:
    """What one geometry's principle measurements pass on to its protocol checks."""

    translation_invariant: bool = False


def _translation(model: TransformerEncoder, layout: PositionLayout, idx: Tensor, gen: torch.Generator) -> float:
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    t = _random_shift(layout.pos_dim, type(model.encoding).requires_grid, gen)
    ref = _pp(_first_logits(model, x, layout), idx)
    new = _pp(_first_logits(model, x, _shift(layout, t)), idx)
    return _rel_max(new, ref)


def _rotation(model: TransformerEncoder, layout: PositionLayout, idx: Tensor, gen: torch.Generator) -> float:
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    rotation = _random_rotation(layout.pos_dim, type(model.encoding).requires_grid, gen)
    ref = _pp(_first_logits(model, x, layout), idx)
    new = _pp(_first_logits(model, x, _rotate(layout, rotation)), idx)
    return _rel_max(new, ref)


def _decay_and_direction(
    model: TransformerEncoder, layout: PositionLayout, idx: Tensor, gen: torch.Generator
) -> tuple[float, float]:
    content = torch.randn(BATCH, 1, DIM, generator=gen).expand(-1, layout.coords.shape[1], -1)
    a = _pp(_first_logits(model, content, layout), idx).double()  # (B, H, n, n)
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
    return rho, ratio.mean().item()


def _context(model: TransformerEncoder, layout: PositionLayout, idx: Tensor, gen: torch.Generator) -> float:
    n = layout.coords.shape[1]
    x = torch.randn(BATCH, n, DIM, generator=gen)
    collapsed = _collapse(layout)

    def positional(delta: Tensor | None) -> tuple[Tensor, Tensor]:
        logits = _first_logits(model, x, layout, delta)
        return logits - _first_logits(model, x, collapsed, delta), logits

    base, logits = positional(None)

    def change(new: Tensor, old: Tensor, ref: Tensor) -> float:
        # -inf - -inf is NaN in Pi: compare where both are finite; a -inf pattern that
        # moves with content is a content-dependent positional term (score 1).
        if not torch.equal(torch.isfinite(new), torch.isfinite(old)):
            return 1.0
        keep = torch.isfinite(old)
        new, old = new[keep], old[keep]
        denom = _rms(old) + _rms(new) + 1e-6 * _rms(ref[torch.isfinite(ref)]) + 1e-30
        return (_rms(new - old) / denom).item() if keep.any() else 0.0

    ratios = [0.0]
    weight = model.blocks[0].attn.qkv.weight.detach().double()
    hd = DIM // HEADS
    for h in range(HEADS):
        rows = torch.cat([weight[h * hd : (h + 1) * hd], weight[DIM + h * hd : DIM + (h + 1) * hd]])
        _, s, vh = torch.linalg.svd(rows)
        rank = int((s > s.max() * 1e-10).sum())
        null = vh[rank:]
        if null.shape[0] == 0:
            continue
        noise = torch.randn(BATCH, n, DIM, generator=gen, dtype=torch.float64)
        delta = noise @ null.T @ null
        delta = delta * (math.sqrt(DIM) / delta.norm(dim=-1, keepdim=True).clamp_min(1e-12))
        new, _ = positional(delta.float())
        ratios.append(change(_pp(new, idx)[:, h], _pp(base, idx)[:, h], _pp(logits, idx)[:, h]))
    order = idx[torch.randperm(len(idx), generator=gen)]
    changed, kept = order[: len(idx) // 2], order[len(idx) // 2 :]
    if len(kept) >= 2:
        delta = torch.zeros(BATCH, n, DIM)
        delta[:, changed] = torch.randn(BATCH, len(changed), DIM, generator=gen)
        new, _ = positional(delta)
        ratios.append(change(_pp(new, kept), _pp(base, kept), _pp(logits, kept)))
    return max(ratios)


@dataclass
class _Spy:
    masks: list[tuple[int, ...] | None] = field(default_factory=list)
    biases: list[tuple[int, ...] | None] = field(default_factory=list)


def _run_spied(model: TransformerEncoder, runs: Iterable[tuple[Tensor, PositionLayout]]) -> _Spy:
    spy = _Spy()
    original_sdpa = F.scaled_dot_product_attention

    def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, *args, **kwargs):
        spy.masks.append(None if attn_mask is None else tuple(attn_mask.shape))
        return original_sdpa(query, key, value, attn_mask, *args, **kwargs)

    layers = {id(b.attn.encoding): b.attn.encoding for b in model.blocks if b.attn.encoding is not None}

    def wrap(method: Callable[..., Tensor | None]) -> Callable[..., Tensor | None]:
        def bias(*args, **kwargs):
            out = method(*args, **kwargs)
            spy.biases.append(None if out is None else tuple(out.shape))
            return out

        return bias

    for layer in layers.values():
        object.__setattr__(layer, "bias", wrap(layer.bias))
    try:
        with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", sdpa), torch.no_grad():
            for x, layout in runs:
                model(x, layout)
    finally:
        for layer in layers.values():
            object.__delattr__(layer, "bias")
    return spy


def _fused(model: TransformerEncoder, layout: PositionLayout, gen: torch.Generator) -> tuple[float, str]:
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    padded, xp = _padded(layout, x, gen)
    spy = _run_spied(model, [(x, layout), (xp, padded)])
    square = [m for m in spy.masks if m is not None and len(m) >= 2 and m[-1] > 1 and m[-2] > 1]
    biases = [b for b in spy.biases if b is not None]
    notes = []
    if biases:
        notes.append(f"bias() returned {biases[0]}")
    if square:
        notes.append(f"attn_mask {square[0]}")
    if not notes:
        masks = sorted({str(m) for m in spy.masks})
        notes.append(f"attn_mask shapes {', '.join(masks)}")
    return float(len(square) + len(biases)), "; ".join(notes)


# --------------------------------------------------------------------------- protocol


def _check_padding(model: TransformerEncoder, layout: PositionLayout, gen: torch.Generator) -> str | None:
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    padded, xp = _padded(layout, x, gen)
    with torch.no_grad():
        ref = model(x, layout)
        out = model(xp, padded)[:, : x.shape[1]]
    ok, diff = _close(out, ref)
    if not ok:
        return f"real-token outputs change by {diff:.3g} when {PAD_TOKENS} padding tokens are appended"
    return None


def _check_cls(
    model: TransformerEncoder, layout: PositionLayout, ctx: _Context, gen: torch.Generator
) -> tuple[str | None, str]:
    enc = model.encoding
    prefix = (~layout.has_pos[0]).nonzero().squeeze(-1)
    n = layout.coords.shape[1]
    x = torch.randn(BATCH, n, DIM, generator=gen)
    problems = []
    with torch.no_grad():
        ref = model(x, layout)
        # (a) prefix coordinates are ignored
        garbage = layout.coords.clone()
        garbage[:, prefix] = torch.randn(BATCH, len(prefix), layout.pos_dim, generator=gen) * 50.0
        ok, diff = _close(model(x, layout.with_coords(garbage)), ref)
        if not ok:
            problems.append(f"(a) garbage CLS coordinates change the outputs by {diff:.3g}")
        # (b) embed adds nothing positional to prefix tokens
        positioned = layout.has_pos[0].nonzero().squeeze(-1)
        perm = positioned[torch.randperm(len(positioned), generator=gen)]
        permuted = layout.coords.clone()
        permuted[:, positioned] = layout.coords[:, perm]
        e1 = enc.embed(x, enc.prepare(layout))[:, prefix]
        e2 = enc.embed(x, enc.prepare(layout.with_coords(permuted)))[:, prefix]
        ok, diff = _close(e2, e1)
        if not ok:
            problems.append(f"(b) the embedded CLS token changes by {diff:.3g} when patch positions are permuted")
        # (c) translation-invariant encodings: shifting the patches changes nothing, CLS included
        scope = "(a, b)"
        if ctx.translation_invariant:
            scope = "(a, b, c)"
            t = _random_shift(layout.pos_dim, type(enc).requires_grid, gen)
            out = model(x, _shift(layout, t))
            ok, diff = _close(out[:, prefix], ref[:, prefix])
            ok_all, diff_all = _close(out, ref)
            if not (ok and ok_all):
                problems.append(
                    f"(c) shifting all patch positions by {t.tolist()} changes the CLS output by {diff:.3g} "
                    f"(all outputs by {diff_all:.3g}) although patch-patch logits are translation-invariant: "
                    "the CLS token is treated as having a position"
                )
    return ("; ".join(problems) if problems else None), scope


def _check_gradients(model: TransformerEncoder, layout: PositionLayout, gen: torch.Generator) -> str | None:
    params = _encoding_parameters(model)
    if not params:
        return None
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    padded, xp = _padded(layout, x, gen)
    model.train()
    try:
        model.zero_grad(set_to_none=True)
        out = model(xp, padded)
        if not torch.isfinite(out).all():
            return "non-finite output in train mode"
        target = torch.randn(out.shape, generator=gen)
        (out * target).sum().backward()
    finally:
        model.eval()
    bad = []
    for name, p in params.items():
        if p.grad is None:
            bad.append(f"{name}: no gradient")
        elif not torch.isfinite(p.grad).all():
            bad.append(f"{name}: non-finite gradient")
        elif not p.grad.any():
            bad.append(f"{name}: gradient identically zero")
    model.zero_grad(set_to_none=True)
    return "; ".join(bad) if bad else None


def _check_extrapolation(model: TransformerEncoder, probe: Probe, gen: torch.Generator) -> tuple[str | None, str]:
    layout = probe.larger_layout(BATCH, gen)
    n = layout.coords.shape[1]
    size = "x".join(map(str, layout.grid_shape)) if layout.grid_shape else f"{n} points"
    x = torch.randn(BATCH, n, DIM, generator=gen)
    with torch.no_grad():
        out = model(x, layout)
    if out.shape != (BATCH, n, DIM):
        return f"output shape {tuple(out.shape)} at {size}", size
    if not torch.isfinite(out).all():
        return f"non-finite output at {size}", size
    return None, size


def _check_cross(model: TransformerEncoder, probe: Probe, gen: torch.Generator) -> tuple[str | None, str]:
    try:
        return _cross(model, probe, gen), "Nq != Nk, key padding and self-consistency hold"
    except NotApplicableError as err:
        return None, f"n/a, the encoding declines cross-attention: {err}"


def _cross(model: TransformerEncoder, probe: Probe, gen: torch.Generator) -> str | None:
    enc = model.encoding
    layer = model.blocks[0].attn.encoding
    self_attn = model.blocks[0].attn
    cross = Attention(DIM, HEADS, layer, cross=True).eval()
    with torch.no_grad():
        cross.q.weight.copy_(self_attn.qkv.weight[:DIM])
        cross.q.bias.copy_(self_attn.qkv.bias[:DIM])
        cross.kv.weight.copy_(self_attn.qkv.weight[DIM:])
        cross.kv.bias.copy_(self_attn.qkv.bias[DIM:])
        cross.proj.load_state_dict(self_attn.proj.state_dict())
    query = enc.prepare(probe.query_layout(BATCH, gen))
    key_raw = probe.layout(BATCH, gen)
    key = enc.prepare(key_raw)
    nq, nk = query.coords.shape[1], key.coords.shape[1]
    xq = torch.randn(BATCH, nq, DIM, generator=gen)
    ctx = torch.randn(BATCH, nk, DIM, generator=gen)
    problems = []
    with torch.no_grad():
        out = cross(xq, query, context=ctx, key=key)
        if out.shape != (BATCH, nq, DIM) or not torch.isfinite(out).all():
            problems.append(f"output shape {tuple(out.shape)} (want {(BATCH, nq, DIM)}) or non-finite")
        logits = cross.logits(xq, query, context=ctx, key=key)
        if logits.shape != (BATCH, HEADS, nq, nk):
            problems.append(f"logits shape {tuple(logits.shape)}, want {(BATCH, HEADS, nq, nk)}")
        elif torch.isnan(logits).any() or (logits == float("inf")).any():
            problems.append("NaN or +inf logits")
        padded_raw, ctx_p = _padded(key_raw, ctx, gen)
        out_p = cross(xq, query, context=ctx_p, key=enc.prepare(padded_raw))
        ok, diff = _close(out_p, out)
        if not ok:
            problems.append(f"padding the keys changes query outputs by {diff:.3g}")
        x = torch.randn(BATCH, nk, DIM, generator=gen)
        ref = self_attn(x, key)
        again = cross(x, key, context=x, key=_copy_layout(key))
        ok, diff = _close(again, ref)
        if not ok:
            problems.append(f"cross-attention onto a copy of its own layout differs from self-attention by {diff:.3g}")
    return "; ".join(problems) if problems else None


# --------------------------------------------------------------------------- driver


def _safe(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    try:
        return fn(), None
    except Exception as err:  # a conformance suite reports crashes, it does not propagate them
        return None, f"{type(err).__name__}: {err}"


def _measure_geometry(
    cls: type[PositionEncoding],
    probe: Probe,
    options: Mapping[str, Any] | EncodingOptions | None,
    seeds: tuple[int, ...],
    report: Report,
) -> dict[Principle, tuple[float | None, str]]:
    """Per-principle (statistic, note) on one geometry, and its protocol checks into ``report``."""
    stats: dict[Principle, list[float]] = {p: [] for p in Principle}
    errors: dict[Principle, str] = {}
    fused_note = ""
    first: TransformerEncoder | None = None
    for seed in seeds:
        model = _build(cls, probe, options, seed)
        first = first or model
        gen = torch.Generator().manual_seed(1000 + seed)
        layout = probe.layout(BATCH, gen)
        idx = layout.has_pos[0].nonzero().squeeze(-1)
        with torch.no_grad():
            tasks: list[tuple[Principle, Callable[[], Any]]] = [
                (Principle.TRANSLATION_INVARIANCE, partial(_translation, model, layout, idx, gen)),
                (Principle.DISTANCE_DECAY, partial(_decay_and_direction, model, layout, idx, gen)),
                (Principle.CONTEXT_AWARENESS, partial(_context, model, layout, idx, gen)),
            ]
            if probe.geometry.pos_dim >= 2:
                tasks.append((Principle.ROTATION_INVARIANCE, partial(_rotation, model, layout, idx, gen)))
            for principle, fn in tasks:
                value, err = _safe(fn)
                if err:
                    errors.setdefault(principle, err)
                    if principle is Principle.DISTANCE_DECAY:
                        errors.setdefault(Principle.DIRECTIONALITY, err)
                elif principle is Principle.DISTANCE_DECAY:
                    stats[Principle.DISTANCE_DECAY].append(value[0])
                    stats[Principle.DIRECTIONALITY].append(value[1])
                else:
                    stats[principle].append(value)
    model = first if first is not None else _build(cls, probe, options, SEEDS[0])
    gen = torch.Generator().manual_seed(2024)
    layout = probe.layout(BATCH, gen)
    value, err = _safe(lambda: _fused(model, layout, gen))
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

    ti = result.get(Principle.TRANSLATION_INVARIANCE, (None, ""))[0]
    ctx = _Context(translation_invariant=ti is not None and ti <= INVARIANCE_TOL)
    _protocol_checks(model, probe, ctx, report)
    return result


def _protocol_checks(model: TransformerEncoder, probe: Probe, ctx: _Context, report: Report) -> None:
    gen = torch.Generator().manual_seed(7)
    layout = probe.layout(BATCH, gen)
    key = probe.key

    def record(name: str, fn: Callable[[], str | None], ok_message: str) -> None:
        problem, err = _safe(fn)
        problem = err or problem
        report.checks.append(CheckResult(name, key, problem is None, problem or ok_message))

    record("padding", lambda: _check_padding(model, layout, gen), "real-token outputs unchanged by padding")
    if probe.geometry.num_prefix_tokens:
        outcome, err = _safe(lambda: _check_cls(model, layout, ctx, gen))
        if err:
            report.checks.append(CheckResult("cls", key, False, err))
        else:
            problem, scope = outcome
            report.checks.append(CheckResult("cls", key, problem is None, problem or f"{scope} hold"))
    count = len(_encoding_parameters(model))
    record(
        "gradients",
        lambda: _check_gradients(model, layout, gen),
        f"finite, non-zero gradients reach all {count} encoding parameters" if count else "no encoding parameters",
    )
    outcome, err = _safe(lambda: _check_extrapolation(model, probe, gen))
    if err:
        report.checks.append(CheckResult("extrapolation", key, False, err))
    else:
        problem, size = outcome
        report.checks.append(CheckResult("extrapolation", key, problem is None, problem or f"finite output at {size}"))
    outcome, err = _safe(lambda: _check_cross(model, probe, gen))
    if err:
        report.checks.append(CheckResult("cross-attention", key, False, err))
    else:
        problem, ok_message = outcome
        report.checks.append(CheckResult("cross-attention", key, problem is None, problem or ok_message))


_CACHE: dict[tuple[str, str], Report] = {}


def clear_cache() -> None:
    _CACHE.clear()


def measure(
    encoding: str | type[PositionEncoding],
    options: Mapping[str, Any] | EncodingOptions | None = None,
    *,
    seeds: tuple[int, ...] = SEEDS,
    use_cache: bool = True,
) -> Report:
    """Measure every principle and run every protocol check for one encoding.

    ``encoding`` is a registered name or a :class:`PositionEncoding` subclass (so a plug-in
    can be checked before it is registered). Results for registered names are cached per
    (name, options) for the process; ``clear_cache`` drops them.
    """
    cls = registry.get(encoding) if isinstance(encoding, str) else encoding
    name = encoding if isinstance(encoding, str) else (cls.name or cls.__name__)
    opts, opts_key = _options_key(options)
    cache_key = (name, opts_key)
    cacheable = use_cache and isinstance(encoding, str) and seeds == SEEDS
    if cacheable and cache_key in _CACHE:
        return _CACHE[cache_key]

    start = time.perf_counter()
    report = Report(encoding=name, options=opts)
    per_geometry: dict[Principle, dict[str, float]] = {p: {} for p in Principle}
    notes: dict[Principle, list[str]] = {p: [] for p in Principle}
    crashed: dict[Principle, bool] = {p: False for p in Principle}
    declared: frozenset[Principle] | None = None
    threads = torch.get_num_threads()
    # The probe tensors are tiny: one thread avoids OpenMP overhead and CPU contention.
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            for probe in PROBES:
                reason = cls.unsupported_reason(probe.geometry)
                if reason:
                    report.not_applicable[probe.key] = reason
                    continue
                try:
                    instance = _build(cls, probe, options, SEEDS[0])
                except NotApplicableError as err:
                    report.not_applicable[probe.key] = str(err)
                    continue
                except Exception as err:
                    report.geometries.append(probe.key)
                    report.checks.append(CheckResult("build", probe.key, False, f"{type(err).__name__}: {err}"))
                    for p in Principle:
                        crashed[p] = True
                    continue
                if declared is None:
                    declared = frozenset(instance.encoding.claimed_principles())
                report.geometries.append(probe.key)
                try:
                    results = _measure_geometry(cls, probe, options, seeds, report)
                except Exception as err:
                    report.checks.append(CheckResult("measure", probe.key, False, f"{type(err).__name__}: {err}"))
                    for p in Principle:
                        crashed[p] = True
                    continue
                for p, (value, note) in results.items():
                    if value is None:
                        crashed[p] = True
                    else:
                        per_geometry[p][probe.key] = value
                    if note:
                        notes[p].append(note if value is None else f"{probe.key}: {note}")
    finally:
        torch.set_num_threads(threads)

    declared = declared or frozenset()
    for p in Principle:
        values = per_geometry[p]
        if crashed[p]:
            measured: bool | None = False
        elif not values:
            measured = None
        else:
            measured = all(_holds(p, v) for v in values.values())
        statistic = _worst(p, values.values()) if values else None
        report.principles[p] = PrincipleResult(
            principle=p,
            declared=p in declared,
            measured=measured if report.geometries else None,
            statistic=statistic,
            per_geometry=dict(values),
            criterion=_CRITERIA[p],
            note="; ".join(notes[p]),
        )
    report.seconds = time.perf_counter() - start
    if cacheable:
        _CACHE[cache_key] = report
    return report


def _holds(p: Principle, value: float) -> bool:
    if p in (Principle.TRANSLATION_INVARIANCE, Principle.ROTATION_INVARIANCE):
        return value <= INVARIANCE_TOL
    if p is Principle.DISTANCE_DECAY:
        return value <= DECAY_THRESHOLD
    if p is Principle.FUSED_KERNEL:
        return value == 0
    return value > EFFECT_TOL


def _worst(p: Principle, values: Iterable[float]) -> float:
    values = list(values)
    if p in (Principle.DIRECTIONALITY, Principle.CONTEXT_AWARENESS):
        return min(values)
    return max(values)


def check(encoding: str | type[PositionEncoding], options: Mapping[str, Any] | EncodingOptions | None = None) -> Report:
    """Same as :func:`measure`; ``check(name).format()`` is the readable report."""
    return measure(encoding, options)


def principles_table(names: Iterable[str] | None = None) -> pd.DataFrame:
    """Rows = encodings, columns = principles; cells "✓", "✗", "n/a" or
    "claimed ✓ (measured ✗)" / "claimed ✗ (measured ✓)" where declaration and measurement differ."""
    names = list(registry.available() if names is None else names)
    rows = {name: measure(name).cells() for name in names}
    table = pd.DataFrame.from_dict(rows, orient="index", columns=[p.value for p in Principle])
    table.index.name = "encoding"
    return table
