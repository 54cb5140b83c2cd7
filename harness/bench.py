"""``pe-bench bench``: forward time, peak memory and positional parameters per encoding
(PaPE Table 4's columns), each relative to ``nopos`` measured in the same run.

Timing interleaves the methods within every repeat (so drift of a noisy machine hits all
of them alike) and reports the median. Peak memory on CPU is the peak resident set of a
fresh subprocess per point above the bare interpreter with torch loaded (torch has no CPU
allocator statistics), so it includes weights and inputs; on CUDA it is
``max_memory_allocated`` during the forward.
"""

from __future__ import annotations

import json
import math
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from pe_bench.adapters import Geometry, PositionLayout
from pe_bench.adapters import build as build_encoding
from pe_bench.harness.attention import Attention
from pe_bench.harness.config import ModelConfig
from pe_bench.tasks.vit import ViT

MODELS: dict[str, tuple[ModelConfig, int]] = {
    # name: (config, image size)
    "vit-b": (ModelConfig(dim=768, depth=12, num_heads=12, patch_size=16), 224),
    "vit-s": (ModelConfig(dim=384, depth=12, num_heads=6, patch_size=16), 224),
    "tiny": (ModelConfig(dim=64, depth=4, num_heads=4, mlp_ratio=2.0, patch_size=4), 24),  # the tiny profile
}


@dataclass
class BenchSpec:
    model: str = "tiny"
    methods: tuple[str, ...] = ("nopos", "sincos", "abspos", "rope", "cape", "pape")
    batch: int = 1
    repeats: int = 10
    image_size: int | None = None
    device: str = "cpu"


def _positional_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if "encoding" in n.split("."))


def _build_vit(method: str, spec: BenchSpec) -> tuple[torch.nn.Module, int]:
    from .methods import parse_method

    config, default_size = MODELS[spec.model]
    size = spec.image_size or default_size
    parsed = parse_method(method)
    model = ViT(parsed.name, dict(parsed.options), config, (size, size), 3, 1000)
    return model.eval().to(spec.device), size


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def forward_table(spec: BenchSpec) -> pd.DataFrame:
    """Per method: median forward time (ms), ratio to nopos, positional parameters."""
    methods = list(dict.fromkeys(("nopos", *spec.methods)))
    models, size = {}, None
    for method in methods:
        models[method], size = _build_vit(method, spec)
    images = torch.randn(spec.batch, 3, size, size, device=spec.device)
    times: dict[str, list[float]] = {m: [] for m in methods}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=spec.device.startswith("cuda"))
    with torch.inference_mode(), autocast:
        for model in models.values():  # warm-up: allocator, kernels, caches
            model(images)
        for _ in range(spec.repeats):
            for method, model in models.items():
                _sync(spec.device)
                start = time.perf_counter()
                model(images)
                _sync(spec.device)
                times[method].append((time.perf_counter() - start) * 1000)
    base = statistics.median(times["nopos"])
    memory = {m: vit_peak_memory(m, spec) for m in methods}
    rows = []
    for method in methods:
        median = statistics.median(times[method])
        rows.append(
            {
                "method": method,
                "forward_ms": round(median, 2),
                "vs_nopos": round(median / base, 3),
                "peak_mib": memory[method],
                "mem_vs_nopos": None if not memory["nopos"] else round(memory[method] / memory["nopos"], 3),
                "pos_params": _positional_parameters(models[method]),
                "params": sum(p.numel() for p in models[method].parameters()),
            }
        )
    return pd.DataFrame(rows).set_index("method")


def vit_peak_memory(method: str, spec: BenchSpec) -> float | None:
    """Peak memory (MiB) of one inference forward of the whole ViT: CUDA allocator peak, or on
    CPU the peak RSS of a fresh subprocess above bare torch (weights and input included)."""
    if spec.device.startswith("cuda"):
        model, size = _build_vit(method, spec)
        images = torch.randn(spec.batch, 3, size, size, device=spec.device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(images)
        torch.cuda.synchronize()
        return round((torch.cuda.max_memory_allocated() - start) / 2**20, 1)
    args = f"{method!r}, {spec.model!r}, {spec.batch}, {spec.image_size!r}"
    result = _in_subprocess(f"from pe_bench.harness.bench import _vit_memory_child as f; print(f({args}))")
    return None if result is None else round(float(result), 1)


def _peak_rss_mib() -> float:
    """Peak resident set of this process. Linux's VmHWM belongs to the process image, whereas
    ru_maxrss survives fork+exec and would report the (larger) parent's peak in a child."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _vit_memory_child(method: str, model_name: str, batch: int, image_size: int | None) -> float:
    """Peak RSS of building the model and running one forward, above the bare torch process.
    (Measured from the start: freed pages are reused, so a delta around the forward alone
    would hide everything below the high-water mark that construction left.)"""
    torch.set_num_threads(1)
    baseline = _peak_rss_mib()
    spec = BenchSpec(model=model_name, batch=batch, image_size=image_size)
    model, size = _build_vit(method, spec)
    with torch.inference_mode():
        model(torch.randn(batch, 3, size, size))
    return _peak_rss_mib() - baseline


def _in_subprocess(code: str) -> str | None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return proc.stdout.strip().splitlines()[-1]


def _attention_layer(method: str, tokens: int, dim: int, heads: int) -> tuple[Attention, torch.Tensor, PositionLayout]:
    from .methods import parse_method

    side = max(int(math.isqrt(tokens)), 1)
    parsed = parse_method(method)
    geometry = Geometry(pos_dim=2, grid_shape=(side, side), num_prefix_tokens=0)
    encoding = build_encoding(parsed.name, geometry, dim, heads, 1, dict(parsed.options))
    layer = Attention(dim, heads, encoding.make_layer(0)).eval()
    layout = encoding.prepare(PositionLayout.grid(1, (side, side)))
    x = encoding.embed(torch.randn(1, side * side, dim), layout)
    return layer, x, layout


def _peak_memory_child(method: str, tokens: int, dim: int, heads: int) -> dict:
    """Runs in a subprocess: peak RSS (MiB) above the bare torch process, and the time, of
    building one attention layer with its inputs and running one forward."""
    torch.set_num_threads(1)
    baseline = _peak_rss_mib()
    with torch.inference_mode():
        layer, x, layout = _attention_layer(method, tokens, dim, heads)
        start = time.perf_counter()
        layer(x, layout)
        elapsed = time.perf_counter() - start
    return {"peak_mib": _peak_rss_mib() - baseline, "ms": elapsed * 1000}


EXPLICIT_BUDGET = 4 * 2**30


def _explicit_pape_bytes(method: str, tokens: int, heads: int) -> float:
    from .methods import parse_method

    spec = parse_method(method)
    options = dict(spec.options)
    if not spec.name.startswith("pape") or options.get("form") != "explicit":
        return 0.0
    m = options.get("m", 50)
    return 4.0 * tokens * tokens * heads * (m + 2)


def sweep_table(methods: list[str], token_counts: list[int], dim: int = 768, heads: int = 12) -> pd.DataFrame:
    """Time and peak memory of one attention layer as the token count grows."""
    rows = []
    for tokens in token_counts:
        for method in methods:
            if _explicit_pape_bytes(method, tokens, heads) > EXPLICIT_BUDGET:
                # The explicit Eq. 9 bias holds a (B, H, N, N, m) tensor: past a few GiB it would
                # only exhaust the machine; the row shows where the efficient form keeps going.
                rows.append({"tokens": tokens, "method": method, "peak_mib": None, "ms": None})
                continue
            code = (
                "import json; from pe_bench.harness.bench import _peak_memory_child as f;"
                f"print(json.dumps(f({method!r}, {tokens}, {dim}, {heads})))"
            )
            result = _in_subprocess(code)
            measured = {"peak_mib": None, "ms": None} if result is None else json.loads(result)
            rows.append({"tokens": tokens, "method": method, **measured})
    frame = pd.DataFrame(rows)
    return frame.pivot(index="tokens", columns="method", values=["peak_mib", "ms"]).round(1)


def header() -> str:
    import lightning

    from .store import device_description

    return (
        f"device: {device_description()} | torch {torch.__version__} | lightning {lightning.__version__} "
        f"| python {sys.version.split()[0]}"
    )
