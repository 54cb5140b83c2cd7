"""Prototype of PaPE's ``frame_tile`` (written before it): one frame per query tile.

Question: the bf16 error of the efficient form (forward with rounded features, and the
backward whatever the forward does; README "PaPE in bf16") grows with |s| / |Δs|, the
distance of the attended keys from the frame's origin over their distance from the query.
The global frame sits at the mean key; a frame at the centre of a small tile of queries
keeps |s| small for every key a query attends to (far keys' terms are as large as their
own, strongly negative, logits, so their rounding stays relative). Does it bring the
narrow, rounded features ("round": q/k width 168 at m = 50, instead of the split's 368)
to the split's forward accuracy, and the gradients to the content gradient's floor?

Setting as ``pe-bench bench --pape-precision`` (dim 256, 4 heads of width 64, the
encoding's initial weights, standard normal tokens; here no CLS and every query row),
the same model of a 16-bit attention backward (``_kernel_gradients``), float64 reference
with the global frame (exact: the frame is a translation, PaPE is invariant to it).
Each tile's queries get features relative to the tile's centre, and so do all keys, per
tile (what a tiled kernel call would need: one k per tile).

Run: python benchmarks/pape-local-frames-2026-11-26/prototype.py
"""

from __future__ import annotations

import copy
import math

import torch

from pe_bench.adapters import Geometry, PositionLayout, build
from pe_bench.adapters.pape import widen_heads
from pe_bench.harness.attention import Attention
from pe_bench.harness.reports.pape_precision import _kernel_gradients

DIM, HEADS = 256, 4


def widened(layer, x, r_q, r_k, q, k, split):
    """PaPE's widened q/k (pape.py's features) for positions already in the wanted frame."""
    s_q, s_k = layer.project(r_q), layer.project(r_k)
    a, b = layer.coefficients(x)
    offset = (a * s_q.square()).sum(-1, keepdim=True) - (b * s_q).sum(-1, keepdim=True)
    q_extra = torch.cat([offset, a, -(2 * a * s_q) + b], -1)
    k_extra = torch.cat([torch.ones_like(s_k[..., :1]), s_k.square(), s_k], -1)
    return widen_heads(q, k, q_extra, k_extra, split, 8)


def tiles_of(side: int, tile: int | None) -> list[torch.Tensor]:
    if tile is None:
        return [torch.arange(side * side)]
    starts = range(0, side, tile)
    return [
        torch.tensor([r * side + c for r in range(r0, min(r0 + tile, side)) for c in range(c0, min(c0 + tile, side))])
        for r0 in starts
        for c0 in starts
    ]


def run(attention, x, coords, upstream, low_precision: bool, tile, split):
    """Softmax of every row (float64) and the gradients of the encoding's parameters."""
    attention.zero_grad(set_to_none=True)
    n, width = x.shape[1], DIM // HEADS
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=low_precision)
    frame_dtype = torch.float32 if low_precision else torch.float64
    probabilities = torch.zeros(1, HEADS, n, n, dtype=torch.float64)
    for rows in tiles_of(math.isqrt(n), tile):
        with autocast:  # q, k, v again per tile: each tile's graph is freed by its backward
            qkv = attention.qkv(x)
        q, k, v = (t.view(1, n, HEADS, width).transpose(1, 2) for t in qkv.chunk(3, -1))
        centre = coords[rows].mean(0) if tile is not None else coords.mean(0)
        r_q, r_k = (coords[rows] - centre).to(frame_dtype)[None], (coords - centre).to(frame_dtype)[None]
        with autocast:
            q_ext, k_ext = widened(attention.encoding, x[:, rows], r_q, r_k, q[:, :, rows], k, split)
        logits = (q_ext.double() @ k_ext.double().transpose(-1, -2)) / math.sqrt(width)
        probabilities[:, :, rows] = logits.softmax(-1)
        d_q, d_k = _kernel_gradients(q_ext, k_ext, v.detach(), upstream[:, :, rows], 1 / math.sqrt(width))
        torch.autograd.backward([q_ext, k_ext], [d_q, d_k])
    return probabilities, {n: p.grad.double() for n, p in attention.named_parameters() if p.grad is not None}


def relative(got: dict, exact: dict, names: list[str]) -> float:
    diff = torch.cat([(got[n] - exact[n]).flatten() for n in names]).norm()
    return float(diff / torch.cat([exact[n].flatten() for n in names]).norm())


def main() -> None:
    variants = [("global, split", None, True), ("global, round", None, False)]
    variants += [(f"tiles {t}x{t}, round", t, False) for t in (8, 4)] + [("tiles 4x4, split", 4, True)]
    print("| grid | frame, features | softmax TV mean / max | grad W_p, W_a, W_b | content grad (qkv) |")
    print("|:--|:--|--:|--:|--:|")
    for side in (14, 32, 64):
        torch.manual_seed(0)
        encoding = build("pape", Geometry(pos_dim=2, grid_shape=(side, side)), DIM, HEADS, 1)
        attention = Attention(DIM, HEADS, encoding.make_layer(0))
        reference = copy.deepcopy(attention).double()
        coords = PositionLayout.grid(1, (side, side)).coords[0].double()
        x = torch.randn(1, side * side, DIM)
        upstream = torch.randn(1, HEADS, side * side, DIM // HEADS)
        exact_p, exact_g = run(reference, x.double(), coords, upstream.double(), False, None, False)
        positional = [n for n in exact_g if n.startswith("encoding.")]
        for label, tile, split in variants:
            if side > 32 and tile is not None and split:
                continue  # 256 tiles of split features outgrow this machine's 24 GiB
            p, g = run(attention, x, coords, upstream, True, tile, split)
            tv = 0.5 * (p - exact_p).abs().sum(-1)
            print(
                f"| {side}² | {label} | {tv.mean():.2g} / {tv.max():.2g} | {relative(g, exact_g, positional):.3g}"
                f" | {relative(g, exact_g, ['qkv.weight']):.3g} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
