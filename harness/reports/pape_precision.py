"""``pe-bench bench --pape-precision``: PaPE's and PaPE-RI's widened q/k in 16-bit, their
softmax and their parameters' gradients against float64 on 14²…128² grids, for each 16-bit
formulation (``low_precision``: round, split, bias; ``frame_tile``), with nopos as the floor that
the content logits' own rounding sets (issue 16; README, Benchmark)."""

from __future__ import annotations

import copy
import math

import pandas as pd
import torch

from pe_bench.adapters import Geometry, PositionLayout
from pe_bench.adapters import build as build_encoding
from pe_bench.harness.attention import Attention

#: frame_tile of the table's tiled variant: 4 x 4 queries per frame.
PRECISION_TILE = 4
#: (column label, encoding options, autocast dtype or None) of ``pape_precision_table``;
#: an encoding without an option a variant sets gets plain autocast in that column.
PRECISION_VARIANTS = (
    ("float32", {}, None),
    ("bf16 round", {"low_precision": "round"}, torch.bfloat16),
    ("bf16 split", {"low_precision": "split"}, torch.bfloat16),
    ("bf16 tiles", {"low_precision": "round", "frame_tile": PRECISION_TILE}, torch.bfloat16),
    ("bf16 bias", {"low_precision": "bias"}, torch.bfloat16),
)


def _query_groups(layer: Attention, x: torch.Tensor, layout: PositionLayout, rows: torch.Tensor, autocast):
    """(query indices, q, k, v, bias) per group of the sampled ``rows`` that the layer's
    encoding transforms together (``frame_tile``), one group at a time: q and k are
    projected again for every group, so that each group's graph (and its keys' widened
    features, one copy per group) is freed before the next. ``bias``: the encoding's bias
    of those queries before SDPA's rounding to q's dtype (``low_precision: bias``), or None."""
    context = torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None)
    with context:
        q, k, v, inputs = layer._raw_heads(x, layout, None, None, False)
        groups = layer.query_groups(inputs)
        if groups is None:
            q, k = layer.transform(q, k, inputs)
            # the sampled rows' bias alone (the frame is the keys'): N x N would not fit at 128²
            bias = layer._bias(q[:, :, rows], k, inputs.for_queries(rows))
    if groups is None:
        yield rows, q[:, :, rows], k, v, bias
        return
    sampled = torch.zeros(x.shape[1], dtype=torch.bool)
    sampled[rows] = True
    for group_rows in groups:
        chosen = group_rows[sampled[group_rows]]
        if len(chosen):
            with context:
                q, k, v, inputs = layer._raw_heads(x, layout, None, None, False)
                group = layer.transform_group(q, k, inputs, chosen)
            yield chosen, group.q, group.k, v, None  # grouping encodings have no bias


def _attention_probabilities(layer: Attention, x: torch.Tensor, layout: PositionLayout, rows: torch.Tensor, autocast):
    """Softmax of the widened-q/k logits of the query ``rows``, as an attention kernel forms
    them: products of the (possibly 16-bit) features exact, sums wide (here float64). Each
    group of queries (``frame_tile``) with its own keys' features."""
    out = torch.empty(1, layer.num_heads, x.shape[1], x.shape[1], dtype=torch.float64)
    with torch.no_grad():
        for query_ids, q, k, _, bias in _query_groups(layer, x, layout, rows, autocast):
            logits = q.double() @ k.double().transpose(-1, -2) / math.sqrt(layer.head_dim)
            if bias is not None:  # as SDPA gets it: rounded to q's dtype (attention_mask)
                logits = logits + bias.to(q.dtype).double()
            out[:, :, query_ids] = logits.softmax(-1)
    return out[:, :, rows]


def _kernel_gradients(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, upstream: torch.Tensor, scale: float, bias=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """dL/dq, dL/dk and dL/dbias (None without a bias) of L = <softmax(q k^T scale + bias) v,
    upstream>, with the roundings of a FlashAttention-style 16-bit backward: the bias rounded
    to q's dtype (as SDPA gets it), P rounded to 16 bits for P V, dS = P (dP - D) rounded to
    16 bits for the dS k and dS^T q products (exact products, wide sums) and returned as the
    bias's gradient, dq and dk returned in q's dtype. For float32 and float64 q, plain
    autograd.

    This is a model of the kernel's arithmetic, not a GPU measurement: FlashAttention-2 (and
    the memory-efficient and cuDNN kernels, which feed the same tensor-core products) hold
    P and dS in the input dtype for their second-stage products."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        inputs = [t.detach().to(q.dtype).requires_grad_() for t in (q, k) + (() if bias is None else (bias,))]
        logits = (inputs[0] @ inputs[1].transpose(-1, -2)) * scale
        out = (logits if bias is None else logits + inputs[2]).softmax(-1) @ v.to(q.dtype)
        grads = torch.autograd.grad((out * upstream.to(q.dtype)).sum(), inputs)
        return grads[0], grads[1], None if bias is None else grads[2]
    low = q.dtype
    wide = lambda t: t.double()  # noqa: E731 (exact products of 16-bit numbers, wide sums)
    logits = (wide(q) @ wide(k).transpose(-1, -2)) * scale
    probabilities = (logits if bias is None else logits + wide(bias.detach().to(low))).softmax(-1)
    out = wide(probabilities.to(low)) @ wide(v)
    d_out = wide(upstream.to(low))
    d_probabilities = d_out @ wide(v).transpose(-1, -2)
    d_scores = wide((probabilities * (d_probabilities - (d_out * out).sum(-1, keepdim=True))).to(low))
    d_q, d_k = (d_scores @ wide(k) * scale).to(low), (d_scores.transpose(-1, -2) @ wide(q) * scale).to(low)
    return d_q, d_k, None if bias is None else d_scores.to(low)


def _gradient_errors(layer: Attention, reference: Attention, x, layout, layout64, rows, autocast) -> dict[str, float]:
    """Relative L2 error, against ``reference`` (float64), of the gradients that flow through
    q and k for a loss on the query ``rows`` (fixed random upstream gradient): of the
    encoding's parameters ("positional", NaN without any) and of the qkv weight ("content")."""

    def gradients(attention: Attention, tokens, positions, cast) -> dict[str, torch.Tensor]:
        attention.zero_grad(set_to_none=True)
        n, scale = tokens.shape[1], 1.0 / math.sqrt(attention.head_dim)
        shape = (1, attention.num_heads, n, attention.head_dim)
        upstream = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        for query_ids, q, k, v, bias in _query_groups(attention, tokens, positions, rows, cast):
            d_q, d_k, d_bias = _kernel_gradients(q, k, v.detach(), upstream[:, :, query_ids], scale, bias)
            if bias is None:
                torch.autograd.backward([q, k], [d_q, d_k])
            else:  # the cast to q's dtype passes the gradient through: float32 from here on
                torch.autograd.backward([q, k, bias], [d_q, d_k, d_bias.to(bias.dtype)])
        return {name: p.grad.double() for name, p in attention.named_parameters() if p.grad is not None}

    got, exact = gradients(layer, x, layout, autocast), gradients(reference, x.double(), layout64, None)

    def error(names: list[str]) -> float:
        if not names:
            return float("nan")
        diff = torch.cat([(got[n] - exact[n]).flatten() for n in names])
        return float(diff.norm() / torch.cat([exact[n].flatten() for n in names]).norm())

    positional = [n for n in exact if n.startswith("encoding.")]
    return {"positional": error(positional), "content": error(["qkv.weight"])}


def pape_precision_table(
    sides: tuple[int, ...] = (14, 32, 64, 128),
    methods: tuple[str, ...] = ("nopos", "pape", "pape-ri"),
    dim: int = 256,
    heads: int = 4,
    queries: int = 256,
    seed: int = 0,
) -> pd.DataFrame:
    """Softmax total variation (mean and max over heads and sampled query rows) of PaPE's
    efficient form on side x side grids (plus a CLS token), against the same weights in
    float64, for each of ``PRECISION_VARIANTS``: float32, and bf16 autocast with the widened
    features rounded to bf16 (the old formulation), split into hi + lo pairs (pape.py's
    default), or rounded in a frame per tile of 4 x 4 queries (``frame_tile``; encodings
    without that option get no such column), or as a float32 positional bias rounded to
    bf16 after the cancellation (``low_precision: bias``).
    Beside it, ``grad``: the relative L2 error of the gradients that reach the encoding's
    parameters through q and k (a loss on the sampled rows, ``_kernel_gradients``' model of
    a 16-bit attention backward), and ``content grad``: the same for the qkv weight.

    Weights are the encodings' initialisation with head width 64 (ViT-B's), inputs standard
    normal. What remains in "bf16 split" is mostly the bf16 rounding of the content q . k,
    which every encoding has in bf16: a method without the ``low_precision`` option (the
    default ``nopos`` row) gets plain bf16 autocast in both bf16 columns and measures that
    floor with the same weights' shapes and inputs.
    """
    from pe_bench.adapters import get as get_encoding
    from pe_bench.harness.grid.methods import parse_method

    rows = []
    for method in methods:
        parsed = parse_method(method)
        fields = get_encoding(parsed.name).Options.model_fields
        for side in sides:
            torch.manual_seed(seed)
            geometry = Geometry(pos_dim=2, grid_shape=(side, side), num_prefix_tokens=1)
            layout = PositionLayout.grid(1, (side, side), 1)
            x = torch.randn(1, side * side + 1, dim)
            query_rows = torch.randperm(side * side + 1)[:queries]
            layers = {}
            for label, options, _ in PRECISION_VARIANTS:
                known = {key: value for key, value in options.items() if key in fields}
                if known and len(known) < len(options):
                    continue  # a formulation this encoding does not have (e.g. frame_tile): no column
                encoding = build_encoding(parsed.name, geometry, dim, heads, 1, {**dict(parsed.options), **known})
                layers[label] = Attention(dim, heads, encoding.make_layer(0)).eval()
                if len(layers) > 1:
                    layers[label].load_state_dict(next(iter(layers.values())).state_dict())
            reference_layer = copy.deepcopy(layers["float32"]).double()
            layout64 = layout.with_coords(layout.coords.double())
            reference = _attention_probabilities(reference_layer, x.double(), layout64, query_rows, None)
            row: dict[str, object] = {"method": method, "grid": f"{side}x{side}"}
            measured = [(label, autocast) for label, _, autocast in PRECISION_VARIANTS if label in layers]
            for label, autocast in measured:
                probabilities = _attention_probabilities(layers[label], x, layout, query_rows, autocast)
                tv = 0.5 * (probabilities - reference).abs().sum(-1)
                row[f"{label} mean"], row[f"{label} max"] = float(tv.mean()), float(tv.max())
            for label, autocast in measured:
                errors = _gradient_errors(
                    layers[label], reference_layer, x, layout, layout64, query_rows, autocast
                )  # fmt: skip
                row[f"{label} grad"] = errors["positional"]
                if label == "bf16 split":  # the default formulation's content gradient: the floor
                    row["bf16 content grad"] = errors["content"]
            rows.append(row)
    table = pd.DataFrame(rows).set_index(["method", "grid"])
    return table[[c for c in table.columns if c != "bf16 content grad"] + ["bf16 content grad"]]
