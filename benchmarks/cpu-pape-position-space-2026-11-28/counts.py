"""PaPE in projected and in position space (adapters/pape.py, ``space``): what a ViT-B/16
224² step costs in machine-independent figures, on this CPU's paths. Per method: computing
operators of a float32 inference forward and training pass at batch 1 (``bench``'s ops_fwd and
ops_train columns), the same training pass under bf16 autocast (GPU training's setting), MiB
a bf16 training step writes at batch 8 (``written_mib_train_b8_bf16``), the widened q/k width,
and the FLOP-model bound on CUDA (what ``bench --throughput`` divides by).

    .venv/bin/python benchmarks/cpu-pape-position-space-2026-11-28/counts.py
"""

from __future__ import annotations

import torch

from pe_bench.harness.attention import attention_kernel
from pe_bench.harness.reports.bench import MODELS, BenchSpec, _build_vit, bf16_mib_written
from pe_bench.harness.reports.op_count import operators_per_pass
from pe_bench.harness.reports.throughput import flop_bound

METHODS = (
    "nopos",
    "pape[space=projected]",
    "pape[space=position]",
    "pape[space=projected,low_precision=round]",
    "pape[space=position,low_precision=round]",
    "pape[space=projected,low_precision=bias]",
    "pape[space=position,low_precision=bias]",
    "pape[space=projected,m=8]",
    "pape[space=position,m=8]",
)


def widened_width(model: torch.nn.Module, images: torch.Tensor) -> int:
    """q's head width as SDPA receives it in a bf16 forward (64 when not widened)."""
    from pe_bench.harness import attention as attention_module

    widths, real = [], attention_module.F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        widths.append(q.shape[-1])
        return real(q, *args, **kwargs)

    attention_module.F.scaled_dot_product_attention = spy
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(images)
    finally:
        attention_module.F.scaled_dot_product_attention = real
    return widths[0]


def main() -> None:
    spec = BenchSpec(model="vit-b", methods=METHODS, batches=(1,), train_batch=8, repeats=1)
    config, size = MODELS["vit-b"]
    columns = ["ops_fwd", "ops_train", "ops_train bf16", "MiB bf16 step b8", "q/k width", "FLOP bound (CUDA)"]
    print("| method | " + " | ".join(columns) + " |")
    print("|:--|--:|--:|--:|--:|--:|--:|")
    for method in METHODS:
        torch.manual_seed(0)
        model, _ = _build_vit(method, spec)
        images = torch.randn(1, 3, size, size)
        with attention_kernel("dense"):
            fwd, train = operators_per_pass(model, images)
            _, train_bf16 = operators_per_pass(model, images, torch.bfloat16)
            written = bf16_mib_written(model, size, spec)
        bound = flop_bound(method, config, size, device="cuda")
        cells = [fwd, train, train_bf16, f"{written:,.1f}", widened_width(model, images), f"{bound:.3f}"]
        print(f"| {method} | " + " | ".join(str(c) for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
