"""Every encoding's attention layer in bf16 autocast, eager and compiled as trainer.compile
compiles (``compile_model``), against the same layer in float64: does compiling change an
encoding's 16-bit accuracy? (Stop 60: under torch 2.11 compiled PaPE lost its bf16 split.)

    python benchmarks/cpu-compiled-bf16-accuracy-2026-11-29/accuracy.py [--device cuda] [--methods a,b]

One layer, width 64, 2 heads, a 16 x 16 grid + CLS, batch 2, inference; the columns are the
largest |output - float64 output| of eager and compiled, and of compiled - eager.
"""

from __future__ import annotations

import argparse
import warnings

import torch

from pe_bench.adapters import Geometry, PositionLayout, available, build
from pe_bench.harness.attention import Attention
from pe_bench.harness.compile import compile_model

GRID = (16, 16)


def layer(method: str) -> Attention:
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=GRID, num_prefix_tokens=1)
    return Attention(64, 2, build(method, geometry, 64, 2, depth=1, options={}).make_layer(0)).eval()


def errors(method: str, device: str) -> tuple[float, float, float]:
    layout = PositionLayout.grid(2, GRID, 1)
    x = torch.randn(2, layout.coords.shape[1], 64, generator=torch.Generator().manual_seed(1))
    reference = layer(method).double()(x.double(), layout.with_coords(layout.coords.double()))
    on_device = PositionLayout(layout.coords.to(device), layout.has_pos.to(device))

    def bf16(attention: Attention) -> torch.Tensor:
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            return attention.to(device)(x.to(device), on_device).double().cpu()

    eager = bf16(layer(method))
    torch._dynamo.reset()
    compiled = bf16(compile_model(layer(method).to(device)))
    return tuple((a - b).abs().max().item() for a, b in ((eager, reference), (compiled, reference), (compiled, eager)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--methods", default=",".join(available()))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, {args.device}")
    print("| method | eager vs float64 | compiled vs float64 | compiled vs eager |")
    print("|:--|--:|--:|--:|")
    for method in args.methods.split(","):
        eager, compiled, apart = errors(method, args.device)
        print(f"| {method} | {eager:.5f} | {compiled:.5f} | {apart:.5f} |", flush=True)


if __name__ == "__main__":
    main()
