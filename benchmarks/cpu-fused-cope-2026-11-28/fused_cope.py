"""CoPE's bias eager against compiled (``cope.FUSED_COPE``), one ViT-B attention layer's bias
(12 heads of 64, CLS + a square grid) forward + backward, float32, on this machine's CPU
(Inductor's C++ kernels; CUDA's Triton kernels fuse differently, so the GPU's figures are
its own). Prints, per batch and grid: the operators the eager bias dispatches forward and
backward (kernels, views left out; the loss's own left out), the kernels Inductor generates
for the compiled one, the MiB each saves for its backward (tensors other than views,
through autograd's saved-tensor hooks), and the median time of each over interleaved
repeats.

    python benchmarks/cpu-fused-cope-2026-11-28/fused_cope.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch._inductor import metrics

from pe_bench.adapters import PositionLayout, cope
from pe_bench.adapters.cope import CoPELayer, cope_bias
from pe_bench.harness.reports.op_count import OperatorCounter

HEADS, WIDTH, REPEATS = 12, 64, 7


def case(batch: int, side: int):
    layout = PositionLayout.grid(batch, (side, side), 1)
    n = layout.coords.shape[1]
    torch.manual_seed(0)
    q, k = (torch.randn(batch, HEADS, n, WIDTH, requires_grad=True) for _ in range(2))
    table = torch.randn(WIDTH, n + 1, requires_grad=True)
    bins = CoPELayer._count_bins(layout)
    args = (q, k, table, *bins, layout.has_pos, layout.has_pos, None)
    return args, (q, k, table, bins, layout.has_pos, layout.has_pos, None)


def step(function, args):
    out = function(*args)
    out.square().sum().backward()


def saved_mib(function, args) -> float:
    """MiB of the tensors (views left out) that one forward of ``function`` saves for backward."""
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t._base is None:
            saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = function(*args)
    out.sum().backward()  # saves nothing
    return sum(saved) / 2**20


def median_ms(runs: dict, name: str) -> float:
    return 1000 * statistics.median(runs[name])


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| batch | grid | eager operators | compiled kernels | eager MiB saved | compiled MiB saved | eager ms |"
          " compiled ms | eager / compiled |")  # fmt: skip
    print("|--:|:--|--:|--:|--:|--:|--:|--:|--:|")
    for batch, side in ((8, 14), (32, 14), (8, 28)):
        fused_args, eager_args = case(batch, side)
        with OperatorCounter() as counter:
            step(cope_bias, eager_args)
        with OperatorCounter() as loss_only:  # the loss's own operators, left out of the count
            step(lambda q, *rest: q * 1, eager_args)
        metrics.reset()
        compiled = cope.FUSED_COPE.compiled
        step(compiled, fused_args)  # compiles forward and backward
        kernels = metrics.generated_kernel_count
        memory = [f"{saved_mib(cope_bias, eager_args):.1f}", f"{saved_mib(compiled, fused_args):.1f}"]
        jobs = {"eager": (cope_bias, eager_args), "compiled": (compiled, fused_args)}
        runs: dict[str, list[float]] = {name: [] for name in jobs}
        for _ in range(REPEATS):  # interleaved: drift hits both alike
            for name, (function, args) in jobs.items():
                start = time.perf_counter()
                step(function, args)
                runs[name].append(time.perf_counter() - start)
        eager, fused = median_ms(runs, "eager"), median_ms(runs, "compiled")
        cells = (
            batch,
            f"{side}x{side}",
            counter.total - loss_only.total,
            kernels,
            *memory,
            f"{eager:.1f}",
            f"{fused:.1f}",
            f"{eager / fused:.2f}",
        )
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
    main()
