"""PaPE's widened heads (``pape.widen_heads``) eager against fused, forward + backward, on this
CPU's Inductor kernels: one ViT-B layer's q and k (strided views of the qkv projection, bf16),
position-space features of a 2-D grid (6 per token, split into hi + lo: 64 + 18 columns,
padded to 88), the keys' features shared by the batch. Medians of interleaved repeats.

    python benchmarks/cpu-fused-widening-2026-11-29/widening.py
"""

from __future__ import annotations

import statistics
import time

import torch

from pe_bench.adapters import pape

HEADS, WIDTH, FEATURES = 12, 64, 6


def inputs(batch: int, tokens: int):
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(batch, tokens, 3, HEADS, WIDTH, generator=gen).to(torch.bfloat16).requires_grad_()
    q_extra = torch.randn(batch, HEADS, tokens, FEATURES, generator=gen).requires_grad_()
    k_extra = torch.randn(1, HEADS, tokens, FEATURES, generator=gen).requires_grad_()
    return qkv, q_extra, k_extra


def step(choice: str, qkv, q_extra, k_extra) -> float:
    start = time.perf_counter()
    q, k, _ = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    with pape.FUSED_WIDENING.chosen(choice):
        wide_q, wide_k = pape.widen_heads(q, k, q_extra, k_extra, True, 8)
    (wide_q.float().sum() + wide_k.float().sum()).backward()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| batch, tokens | eager ms | fused ms | eager / fused |")
    print("|---|--:|--:|--:|")
    for batch, tokens in ((8, 197), (32, 197), (8, 785)):
        tensors = inputs(batch, tokens)
        for choice in ("eager", "fused"):  # warm-up: compiles the fused form
            step(choice, *tensors)
        times = {"eager": [], "fused": []}
        for _ in range(9):
            for choice in times:
                times[choice].append(step(choice, *tensors))
        eager, fused = (statistics.median(times[c]) for c in ("eager", "fused"))
        print(f"| {batch}, {tokens} | {eager:.2f} | {fused:.2f} | {eager / fused:.2f} |")


if __name__ == "__main__":
    main()
