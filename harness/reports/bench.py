"""``pe-bench bench``: PaPE Table 4 per encoding (inference time per image at batch 1 and 32,
training-step time, peak memory, positional parameters, the SDPA kernel used), each relative
to ``nopos`` measured in the same run; and a sequence-length sweep of one attention layer.

Timing uses ``torch.utils.benchmark`` (it synchronises CUDA, pins the thread count and
warms up before each sample) and interleaves the methods within every repeat, so drift of
a noisy machine hits all of them alike. Each time is reported as the median with its
interquartile range (``*_iqr``) beside it. FLOPs per image come from
``torch.utils.flop_counter.FlopCounterMode`` on one inference forward: matrix products,
convolutions and attention; elementwise work (RoPE's rotation, softmax) is not counted.
Peak memory on CPU is the peak resident set of a
fresh subprocess per point above the bare interpreter with torch loaded (torch has no CPU
allocator statistics), so it includes weights and inputs; on CUDA it is
``max_memory_allocated`` during the forward.
"""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch.utils import benchmark
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from pe_bench.adapters import EncodingFactory, Geometry, PositionLayout
from pe_bench.adapters import build as build_encoding
from pe_bench.adapters.base import positional_parameters
from pe_bench.harness.attention import Attention
from pe_bench.harness.config import ModelConfig
from pe_bench.tasks._shared.vit import ViT, image_geometry

MODELS: dict[str, tuple[ModelConfig, int]] = {
    # name: (config, image size)
    "vit-b": (ModelConfig(dim=768, depth=12, num_heads=12, patch_size=16), 224),
    "vit-s": (ModelConfig(dim=384, depth=12, num_heads=6, patch_size=16), 224),
    "tiny": (ModelConfig(dim=64, depth=4, num_heads=4, mlp_ratio=2.0, patch_size=4), 24),  # the tiny profile
}


# PaPE Table 4's columns: the baselines, then PaPE for m in {2, ..., 64}.
TABLE4_METHODS = (
    "nopos", "sincos", "alibi", "rope", "rope-mixed", "abspos", "cape", "pape",
    "pape[m=2]", "pape[m=4]", "pape[m=8]", "pape[m=16]", "pape[m=32]", "pape[m=64]",
)  # fmt: skip


@dataclass
class BenchSpec:
    model: str = "tiny"
    methods: tuple[str, ...] = TABLE4_METHODS
    batches: tuple[int, ...] = (1, 32)  # inference time per image at each batch size
    train_batch: int = 32  # batch of the training-step column; 0 leaves it out
    repeats: int = 10
    image_size: int | None = None
    device: str = "cpu"
    threads: int | None = None  # torch threads while timing (None: torch's current setting)


def _positional_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for _, p in positional_parameters(model))


def _build_vit(method: str, spec: BenchSpec) -> tuple[torch.nn.Module, int]:
    from pe_bench.harness.grid.methods import parse_method

    config, default_size = MODELS[spec.model]
    size = spec.image_size or default_size
    parsed = parse_method(method)
    make_encoding = EncodingFactory(parsed.name, dict(parsed.options))
    model = ViT(make_encoding, image_geometry((size, size), config.patch_size), config, 3, 1000)
    return model.eval().to(spec.device), size


def _autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))


def _inference(model: torch.nn.Module, images: torch.Tensor, device: str) -> None:
    with torch.inference_mode(), _autocast(device):
        model.eval()(images)


class _TrainStep:
    """One optimiser step (forward, cross-entropy, backward, AdamW) on a fixed batch."""

    def __init__(self, model: torch.nn.Module, images: torch.Tensor, device: str) -> None:
        self.model, self.images, self.device = model, images, device
        self.labels = torch.zeros(images.shape[0], dtype=torch.long, device=images.device)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def __call__(self) -> None:
        self.model.train()
        with _autocast(self.device):
            loss = torch.nn.functional.cross_entropy(self.model(self.images).float(), self.labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def sdpa_backend(model: torch.nn.Module, images: torch.Tensor, device: str) -> str:
    """The SDPA kernels PyTorch picks inside the model's attention layers (e.g. FLASH_ATTENTION,
    EFFICIENT_ATTENTION, MATH; MATH materialises the N x N logits), as one name or "a+b"."""
    from torch.nn.attention import SDPBackend

    from pe_bench.harness import attention as attention_module

    real = attention_module.F.scaled_dot_product_attention
    chosen: set[str] = set()

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        chosen.add(SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale)).name)
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

    attention_module.F.scaled_dot_product_attention = spy
    try:
        _inference(model, images, device)
    finally:
        attention_module.F.scaled_dot_product_attention = real
    return "+".join(sorted(chosen)) or "none (own attention)"


def forward_table(spec: BenchSpec) -> pd.DataFrame:
    """PaPE Table 4 and more, per method: inference time per image at each batch size, one
    training step, peak inference memory, positional parameters; each with its ratio to nopos
    measured in the same run."""
    methods = list(dict.fromkeys(("nopos", *spec.methods)))
    models, size = {}, None
    for method in methods:
        models[method], size = _build_vit(method, spec)
    inputs = {b: torch.randn(b, 3, size, size, device=spec.device) for b in spec.batches}
    # (column, images per call, callable) for every measurement of every method
    jobs: dict[str, list[tuple[str, int, object]]] = {}
    for method, model in models.items():
        jobs[method] = [
            (f"infer_ms_per_image_b{b}", b, lambda m=model, x=x: _inference(m, x, spec.device))
            for b, x in inputs.items()
        ]
        if spec.train_batch:
            images = torch.randn(spec.train_batch, 3, size, size, device=spec.device)
            jobs[method].append((f"train_step_ms_b{spec.train_batch}", 1, _TrainStep(model, images, spec.device)))
    threads = spec.threads or torch.get_num_threads()
    samples: dict[tuple[str, str], list[benchmark.Measurement]] = {}
    for _ in range(spec.repeats):  # interleaved, so a noisy machine's drift hits every method alike
        for method in methods:
            for column, _, job in jobs[method]:
                timer = benchmark.Timer("job()", globals={"job": job}, num_threads=threads, label=column,
                                        sub_label=method)  # fmt: skip
                samples.setdefault((method, column), []).append(timer.timeit(number=1))
    times = {key: benchmark.Measurement.merge(measured)[0] for key, measured in samples.items()}
    memory = {m: vit_peak_memory(m, spec) for m in methods}
    first = inputs[spec.batches[0]]
    rows = []
    for method in methods:
        row: dict[str, object] = {"method": method}
        for column, per_call, _ in jobs[method]:
            measured = times[(method, column)]
            row[column] = round(measured.median * 1000 / per_call, 3)
            row[f"{column}_iqr"] = round(measured.iqr * 1000 / per_call, 3)
            row[f"{column}_vs_nopos"] = round(measured.median / times[("nopos", column)].median, 3)
        row["gflops_per_image"] = round(flops_per_image(models[method], size, spec.device) / 1e9, 4)
        row["peak_mib"] = memory[method]
        row["mem_vs_nopos"] = None if not memory["nopos"] or memory[method] is None else round(
            memory[method] / memory["nopos"], 3
        )  # fmt: skip
        row["pos_params"] = _positional_parameters(models[method])
        row["params"] = sum(p.numel() for p in models[method].parameters())
        row["sdpa"] = sdpa_backend(models[method], first, spec.device)
        rows.append(row)
    return pd.DataFrame(rows).set_index("method")


def _cpu_flash_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# The CPU kernel of fused attention, which FlopCounterMode does not know (it counts the CUDA ones).
_EXTRA_FLOP_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_attention_flops}


def flops_per_image(model: torch.nn.Module, size: int, device: str) -> int:
    """FLOPs of one inference forward of one image (FlopCounterMode: matmuls, convolutions, attention)."""
    images = torch.randn(1, 3, size, size, device=device)
    with torch.inference_mode(), FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOP_FORMULAS) as counter:
        model.eval()(images)
    return counter.get_total_flops()


def vit_peak_memory(method: str, spec: BenchSpec) -> float | None:
    """Peak memory (MiB) of one inference forward of the whole ViT: CUDA allocator peak, or on
    CPU the peak RSS of a fresh subprocess above bare torch (weights and input included)."""
    if spec.device.startswith("cuda"):
        model, size = _build_vit(method, spec)
        images = torch.randn(spec.batches[0], 3, size, size, device=spec.device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(images)
        torch.cuda.synchronize()
        return round((torch.cuda.max_memory_allocated() - start) / 2**20, 1)
    args = f"{method!r}, {spec.model!r}, {spec.batches[0]}, {spec.image_size!r}"
    result = _in_subprocess(f"from pe_bench.harness.reports.bench import _vit_memory_child as f; print(f({args}))")
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
    spec = BenchSpec(model=model_name, batches=(batch,), image_size=image_size)
    model, size = _build_vit(method, spec)
    with torch.inference_mode():
        model(torch.randn(batch, 3, size, size))
    return _peak_rss_mib() - baseline


def _in_subprocess(code: str) -> str | None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        # The point stays empty in the table (e.g. out of memory); say why rather than hide it.
        reason = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        print(f"bench: a measurement subprocess failed: {reason}", file=sys.stderr)
        return None
    return proc.stdout.strip().splitlines()[-1]


def _attention_layer(method: str, tokens: int, dim: int, heads: int) -> tuple[Attention, torch.Tensor, PositionLayout]:
    from pe_bench.harness.grid.methods import parse_method

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
    from pe_bench.harness.grid.methods import parse_method

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
                "import json; from pe_bench.harness.reports.bench import _peak_memory_child as f;"
                f"print(json.dumps(f({method!r}, {tokens}, {dim}, {heads})))"
            )
            result = _in_subprocess(code)
            measured = {"peak_mib": None, "ms": None} if result is None else json.loads(result)
            rows.append({"tokens": tokens, "method": method, **measured})
    frame = pd.DataFrame(rows)
    return frame.pivot(index="tokens", columns="method", values=["peak_mib", "ms"]).round(1)


def header() -> str:
    import lightning

    from pe_bench.harness.grid.store import device_description

    return (
        f"device: {device_description()} | torch {torch.__version__} | lightning {lightning.__version__} "
        f"| python {sys.version.split()[0]}"
    )
