"""SDPA's forward + backward time by q/k head width: what the widened heads of PaPE's efficient
form pay inside the attention kernel itself.

PaPE and PaPE-RI widen q and k by their positional features (ViT-B/16 in bf16: 72 to 120
columns in position space and at small m, 368 in projected space at m = 50) while v stays
64 wide on CUDA. The FLOP model (harness/reports/throughput.py) counts the extra q.k
products only, a few per cent of a step; a kernel tiled for head widths of 64 and 128 may
run 72-120 at 128's cost, which would explain part of what the H200 measured on 11-27
(pape[m=8] 1.45x and pape-ri 1.53x their bounds, both on cuDNN). Each width runs twice: v at
64 (what pe-bench passes on CUDA) and v as wide as q (the zero-padded v the CPU kernels
need), with the kernel SDPA picks; ``vs_base``: the narrow-v time relative to the first
width's (64 by default), beside the ratio of the attention's FLOPs.

    python benchmarks/sdpa_head_width.py --device cuda            # ViT-B at batch 128, bf16
    python benchmarks/sdpa_head_width.py --batch 2 --widths 64,88  # a quick look on the CPU
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend
from torch.utils import benchmark

WIDTHS = (64, 72, 80, 88, 96, 104, 120, 128, 168, 256, 368)


def kernel(q, k, v) -> str:
    """The backend SDPA picks for these inputs (no mask, no dropout)."""
    return SDPBackend(torch._fused_sdp_choice(q, k, v)).name


def median_ms(q, k, v, repeats: int) -> float:
    """Median ms of one forward + backward (loss: the output's sum)."""

    def step():
        torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()

    step()  # warm-up: kernel selection, workspaces
    timer = benchmark.Timer("step()", globals={"step": step})
    return timer.timeit(repeats).median * 1000


def rows(device: str, batch: int, heads: int, tokens: int, widths: list[int], repeats: int) -> list[dict]:
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    base = widths[0]

    def tensor(width: int) -> torch.Tensor:
        return torch.randn(batch, heads, tokens, width, device=device, dtype=dtype, requires_grad=True)

    out, reference = [], None
    for width in widths:
        q, k = tensor(width), tensor(width)
        row = {"qk_width": width}
        for label, v in (("v_base", tensor(base)), ("v_same", tensor(width))):
            try:
                row[f"{label}_kernel"] = kernel(q, k, v)
                row[f"{label}_ms"] = round(median_ms(q, k, v, repeats), 3)
            except RuntimeError as error:  # a width no kernel takes: a table entry, not a crash
                row[f"{label}_kernel"], row[f"{label}_ms"] = f"error: {str(error).splitlines()[0][:60]}", None
        reference = reference or row["v_base_ms"]
        row["vs_base"] = None if row["v_base_ms"] is None else round(row["v_base_ms"] / reference, 3)
        row["qk_flops_vs_base"] = round((width + base) / (2 * base), 3)  # q.k and p.v, v at the base width
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=197)
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="q/k widths, the first the base")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    table = rows(args.device, args.batch, args.heads, args.tokens, widths, args.repeats)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"# SDPA forward + backward by q/k width: {name}, torch {torch.__version__}, batch {args.batch},"
          f" {args.heads} heads, {args.tokens} tokens, median of {args.repeats}")  # fmt: skip
    columns = list(table[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "--:|" * len(columns))
    for row in table:
        print("| " + " | ".join("" if row[c] is None else str(row[c]) for c in columns) + " |", flush=True)
    return table


if __name__ == "__main__":
    main()
