"""The protocol checks every encoding must pass, on every probe geometry it supports.

They run on the first seed's encoder probe (:mod:`.probes`) with its encoding parameters
randomised (:func:`~.probes.randomise_encoding`), as the fused-kernel statistic does.
Outputs are compared with max |a - b| <= ``PROTOCOL_TOL`` (1e-4) * max(1, max |b|).

* token order: the positioned tokens are permuted (one random permutation), together with
  their coordinates and has_pos, position-free tokens staying in place; the outputs of the
  depth-2 encoder in eval mode must be the permuted outputs. Positions come from
  ``layout.coords``, so an encoding that reads token order instead (a table indexed by
  token index, a bias by index) fails.
* padding: 3 padding tokens (valid False, content ~ N(0, 10^2), positions ~ N(0, 50^2),
  has_pos True) appended after the real tokens (after the grid on grid geometries, with
  the layout's grid_shape unchanged); the real tokens' outputs of the depth-2 encoder in
  eval mode must equal those without padding. (Non-finite garbage is not tested here,
  although the encoder clears padding with ``torch.where``, which removes NaN too.)
* cls (geometries with prefix tokens): a prefix token's own positional contribution is nil:
    (a) its coordinate entries are ignored: garbage coordinates (~ N(0, 50^2)) for the CLS
        change no output;
    (b) ``embed`` gives it nothing positional: permuting the patch positions leaves the
        embedded CLS token unchanged;
    (c) for encodings measured translation-invariant on this geometry, shifting all patch
        positions leaves every output, the CLS output included, unchanged. An encoding
        that is relative between patches but treats the CLS as sitting at some position
        (e.g. an identity rotation, which *is* position 0) fails here;
    (d) non-finite entries too: with the CLS coordinates NaN, +inf and -inf in turn (a
        loader's "no position"), every output equals (a)'s reference, and in train mode a
        random linear loss gives every parameter of the encoding a finite gradient. An
        encoding that zeroes the CLS rows by weighting them with 0 (NaN x 0 = NaN) fails.
* gradients: in train mode with padding, a random linear loss of the encoder output gives
  every parameter of the encoding (model level and per layer) a gradient that is not
  None, finite and not identically zero.
* extrapolation: a larger grid (8 x 8; 40 tokens) or more, more spread points (60 in an
  8 m box) than the encoding was built for: no exception, finite output of the right shape.
* cross-attention: ``Attention(..., cross=True)`` with the first layer's encoding and the
  self-attention weights, queries (3 x 3 grid + CLS; 7 tokens; 9 points) fewer than keys:
  finite output of shape (B, Nq, D) and logits (B, H, Nq, Nk) without NaN or +inf; padding
  the keys changes no query output; and cross-attention of a sequence onto itself (a copy
  of its layout, not the same object) reproduces self-attention. An encoding that declines
  cross-attention (``NotApplicableError``) passes as n/a.
* query chunks (encodings whose dense bias the attention core may build a chunk of queries
  at a time, ``LayerEncoding.bias_by_query_chunks``): with padding as above, the outputs of
  the depth-2 encoder in eval mode with the bias built one query at a time
  (``dense_bias_chunk_elements(1)``) equal those with the whole bias. Encodings without a
  dense bias, or that build it for all queries at once, pass as n/a.
* qk basis (encodings whose q/k transform starts with a position-free linear map,
  ``LayerEncoding.qk_basis``): with padding as above, the outputs of the depth-2 encoder in
  eval mode with the map folded into every layer's q/k projections equal those with it
  applied to every token's q and k (each forced, whatever the encoding's own choice).
  Encodings without such a map pass as n/a.

A check that raises fails with the exception as its message.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from unittest import mock

import torch
from torch import Tensor

from pe_bench.adapters.base import NotApplicableError, PositionLayout

from ..attention import Attention, dense_bias_chunk_elements
from ..blocks import TransformerEncoder
from .probes import BATCH, DIM, HEADS, PAD_TOKENS, Probe, random_shift, run_safely, shift, with_padding

PROTOCOL_TOL = 1e-4

__all__ = ["PROTOCOL_TOL", "CheckResult", "run_checks"]


@dataclass
class CheckResult:
    """One protocol check on one geometry: passed, and the problem or what was verified."""

    name: str
    geometry: str
    passed: bool
    message: str


#: A check's outcome: (problem, or None when it passed; what a pass verified).
Outcome = tuple[str | None, str]


def _close(new: Tensor, ref: Tensor) -> tuple[bool, float]:
    if new.shape != ref.shape:
        return False, math.inf
    diff = (new - ref).abs().max().item() if new.numel() else 0.0
    bound = PROTOCOL_TOL * max(1.0, ref.abs().max().item() if ref.numel() else 1.0)
    return bool(math.isfinite(diff) and diff <= bound), diff


def _copy_layout(layout: PositionLayout) -> PositionLayout:
    return PositionLayout(
        coords=layout.coords.clone(),
        has_pos=layout.has_pos.clone(),
        valid=None if layout.valid is None else layout.valid.clone(),
        grid_shape=layout.grid_shape,
    )


def encoding_parameters(model: TransformerEncoder) -> dict[str, torch.nn.Parameter]:
    """Every parameter of the encoding, model level (``encoding.*``) and per layer (``layer{i}.*``),
    each once."""
    params: dict[int, tuple[str, torch.nn.Parameter]] = {}
    for name, p in model.encoding.named_parameters():
        params.setdefault(id(p), (f"encoding.{name}", p))
    for i, block in enumerate(model.blocks):
        layer = block.attn.encoding
        if layer is not None:
            for name, p in layer.named_parameters():
                params.setdefault(id(p), (f"layer{i}.{name}", p))
    return dict(params.values())


def check_token_order(model: TransformerEncoder, layout: PositionLayout, gen: torch.Generator) -> Outcome:
    n = layout.coords.shape[1]
    x = torch.randn(BATCH, n, DIM, generator=gen)
    pos = layout.has_pos[0].nonzero().squeeze(-1)
    order = torch.arange(n)
    order[pos] = pos[torch.randperm(len(pos), generator=gen)]
    permuted = PositionLayout(
        coords=layout.coords[:, order].clone(),
        has_pos=layout.has_pos[:, order].clone(),
        valid=None if layout.valid is None else layout.valid[:, order].clone(),
        grid_shape=layout.grid_shape,
    )
    with torch.no_grad():
        ref = model(x, layout)[:, order]
        out = model(x[:, order], permuted)
    ok, diff = _close(out, ref)
    if not ok:
        return (
            f"permuting the tokens together with their coordinates changes the outputs by {diff:.3g} "
            "beyond permuting them: the encoding reads token order, not layout.coords"
        ), ""
    return None, f"outputs permute with the tokens and their coordinates ({diff:.2g})"


def check_padding(model: TransformerEncoder, layout: PositionLayout, gen: torch.Generator) -> Outcome:
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    padded, xp = with_padding(layout, x, PAD_TOKENS, gen)
    with torch.no_grad():
        ref = model(x, layout)
        out = model(xp, padded)[:, : x.shape[1]]
    ok, diff = _close(out, ref)
    if not ok:
        return f"real-token outputs change by {diff:.3g} when {PAD_TOKENS} padding tokens are appended", ""
    return None, "real-token outputs unchanged by padding"


def check_cls(
    model: TransformerEncoder, layout: PositionLayout, translation_invariant: bool, gen: torch.Generator
) -> Outcome:
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
        if translation_invariant:
            scope = "(a, b, c)"
            t = random_shift(layout.pos_dim, gen, grid=type(enc).requires_grid)
            out = model(x, shift(layout, t))
            ok, diff = _close(out[:, prefix], ref[:, prefix])
            ok_all, diff_all = _close(out, ref)
            if not (ok and ok_all):
                problems.append(
                    f"(c) shifting all patch positions by {t.tolist()} changes the CLS output by {diff:.3g} "
                    f"(all outputs by {diff_all:.3g}) although patch-patch logits are translation-invariant: "
                    "the CLS token is treated as having a position"
                )
    problems += _non_finite_cls_problems(model, layout, prefix, x, ref)
    return ("; ".join(problems) if problems else None), f"{scope[:-1]}, d) hold"


def _non_finite_cls_problems(
    model: TransformerEncoder, layout: PositionLayout, prefix: Tensor, x: Tensor, ref: Tensor
) -> list[str]:
    """Part (d) of the cls check: NaN and infinite CLS coordinates, outputs and gradients."""
    problems = []
    params = encoding_parameters(model)
    was_training = model.training
    try:
        for value in (math.nan, math.inf, -math.inf):
            coords = layout.coords.clone()
            coords[:, prefix] = value
            bad = layout.with_coords(coords)
            with torch.no_grad():
                model.eval()
                out = model(x, bad)
            ok, diff = _close(out, ref)
            if not ok:
                problems.append(f"(d) CLS coordinates {value} change the outputs by {diff:.3g}")
            model.train()
            model.zero_grad(set_to_none=True)
            out = model(x, bad)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            broken = [n for n, p in params.items() if p.grad is not None and not torch.isfinite(p.grad).all()]
            if broken:
                problems.append(f"(d) CLS coordinates {value} make non-finite gradients of {', '.join(broken)}")
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return problems


def check_gradients(model: TransformerEncoder, layout: PositionLayout, gen: torch.Generator) -> Outcome:
    params = encoding_parameters(model)
    if not params:
        return None, "no encoding parameters"
    passed = f"finite, non-zero gradients reach all {len(params)} encoding parameters"
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    padded, xp = with_padding(layout, x, PAD_TOKENS, gen)
    model.train()
    try:
        model.zero_grad(set_to_none=True)
        out = model(xp, padded)
        if not torch.isfinite(out).all():
            return "non-finite output in train mode", passed
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
    return ("; ".join(bad) if bad else None), passed


def check_extrapolation(model: TransformerEncoder, probe: Probe, gen: torch.Generator) -> Outcome:
    layout = probe.larger_layout(BATCH, gen)
    n = layout.coords.shape[1]
    size = "x".join(map(str, layout.grid_shape)) if layout.grid_shape else f"{n} points"
    passed = f"finite output at {size}"
    x = torch.randn(BATCH, n, DIM, generator=gen)
    with torch.no_grad():
        out = model(x, layout)
    if out.shape != (BATCH, n, DIM):
        return f"output shape {tuple(out.shape)} at {size}", passed
    if not torch.isfinite(out).all():
        return f"non-finite output at {size}", passed
    return None, passed


def check_cross(model: TransformerEncoder, probe: Probe, gen: torch.Generator) -> Outcome:
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
        padded_raw, ctx_p = with_padding(key_raw, ctx, PAD_TOKENS, gen)
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


def check_query_chunks(model: TransformerEncoder, layout: PositionLayout, gen: torch.Generator) -> Outcome:
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    padded, xp = with_padding(layout, x, PAD_TOKENS, gen)
    real = x.shape[1]
    # counted, to tell a pass from an encoding whose bias was never built in chunks
    counting = mock.patch.object(
        Attention, "_chunked_bias_attention", autospec=True, side_effect=Attention._chunked_bias_attention
    )
    with torch.no_grad():
        ref = model(xp, padded)[:, :real]
        with counting as spy, dense_bias_chunk_elements(1):
            out = model(xp, padded)[:, :real]
    if spy.call_count == 0:
        return None, "n/a, no dense bias built in query chunks (none, or one built for all queries at once)"
    ok, diff = _close(out, ref)
    if not ok:
        return f"building the bias one query at a time changes the outputs by {diff:.3g}", ""
    return None, f"outputs unchanged with the bias built one query at a time ({spy.call_count} layers)"


def check_qk_basis(model: TransformerEncoder, layout: PositionLayout, gen: torch.Generator) -> Outcome:
    x = torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen)
    padded, xp = with_padding(layout, x, PAD_TOKENS, gen)
    real = x.shape[1]
    layers = [block.attn.encoding for block in model.blocks if block.attn.encoding is not None]
    with torch.no_grad():
        layers = [layer for layer in layers if layer.qk_basis() is not None]
    if not layers:
        return None, "n/a, no position-free basis change of q and k (qk_basis)"

    def outputs(fold: bool) -> Tensor:
        with contextlib.ExitStack() as stack, torch.no_grad():
            for layer in layers:
                stack.enter_context(mock.patch.object(layer, "fold_qk_basis", return_value=fold))
            return model(xp, padded)[:, :real]

    ok, diff = _close(outputs(True), outputs(False))
    if not ok:
        return f"folding qk_basis into the q/k projections changes the outputs by {diff:.3g}", ""
    return None, f"outputs unchanged with qk_basis folded into the projections ({len(layers)} layers)"


def run_checks(model: TransformerEncoder, probe: Probe, translation_invariant: bool) -> list[CheckResult]:
    """Every protocol check on one geometry, in a fixed order that shares one generator.

    ``translation_invariant``: whether the principle statistics measured the encoding
    translation-invariant on this geometry (enables part (c) of the cls check).
    """
    gen = torch.Generator().manual_seed(7)
    layout = probe.layout(BATCH, gen)
    checks: list[tuple[str, Callable[[], Outcome]]] = [
        ("token order", partial(check_token_order, model, layout, gen)),
        ("padding", partial(check_padding, model, layout, gen)),
    ]
    if probe.geometry.num_prefix_tokens:
        checks.append(("cls", partial(check_cls, model, layout, translation_invariant, gen)))
    checks += [
        ("gradients", partial(check_gradients, model, layout, gen)),
        ("extrapolation", partial(check_extrapolation, model, probe, gen)),
        ("cross-attention", partial(check_cross, model, probe, gen)),
        ("query chunks", partial(check_query_chunks, model, layout, gen)),
        ("qk basis", partial(check_qk_basis, model, layout, gen)),
    ]
    results = []
    for name, check in checks:
        outcome, err = run_safely(check)
        problem, passed = (err, "") if err else outcome
        results.append(CheckResult(name, probe.key, problem is None, problem or passed))
    return results
