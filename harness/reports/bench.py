"""``pe-bench bench``: PaPE Table 4 per encoding (inference time per image at batch 1 and 32,
training-step time, peak memory, positional parameters, the SDPA kernel used), each relative
to ``nopos`` measured in the same run; and a sequence-length sweep of one attention layer.

Timing uses ``torch.utils.benchmark`` (it synchronises CUDA, pins the thread count and
warms up before each sample) and interleaves the methods within every repeat, so drift of
a noisy machine hits all of them alike. Each time is reported as the median with its
interquartile range (``*_iqr``) beside it. FLOPs per image come from
``torch.utils.flop_counter.FlopCounterMode`` on one inference forward: matrix products,
convolutions and attention; elementwise work (RoPE's rotation, softmax) is not counted.
``ops_fwd`` / ``ops_train`` count the computing operators (kernels; views left out) of one
inference forward and one training forward + backward at batch 1 (``op_count.py``): the
machine-independent figure behind eager per-operator overhead, which dominates small
batches on a GPU; ``written_mib_train_b{B}_bf16`` the MiB their outputs take in one
bf16-autocast training forward + backward at the training batch: the figure behind an
eager step's memory-bound elementwise work at large batches. Both count this device's
path (on CPU the bias encodings' dense bias and PaPE's zero-padded v). Peak
memory on CPU is the peak resident set of a fresh subprocess per point above the bare
interpreter with torch loaded (torch has no CPU allocator statistics), so it includes
weights and inputs; on CUDA it is
``max_memory_allocated`` during the forward.
"""

from __future__ import annotations

import copy
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from torch.utils import benchmark
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from pe_bench.adapters import EncodingFactory, Geometry, PositionLayout
from pe_bench.adapters import build as build_encoding
from pe_bench.adapters.base import positional_parameters
from pe_bench.harness.attention import Attention, attention_kernel, set_attention_kernel, wants_flex
from pe_bench.harness.config import ModelConfig
from pe_bench.harness.reports.op_count import bytes_written_per_step, operators_per_pass
from pe_bench.harness.reports.paired import PairedTiming, paired_timing
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
    compile: bool = False  # torch.compile every model (pe-bench bench --compile)
    # the bias encodings' kernel (pe-bench bench --attention-kernel; harness/attention.py)
    attention_kernel: str = "auto"


def _positional_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for _, p in positional_parameters(model))


#: the timm model each bench model matches (same width, depth, heads, patch, classes): the
#: throughput table's reference row ``timm``, which issue 16 asks nopos to keep up with.
TIMM_MODELS = {"vit-b": "vit_base_patch16_224", "vit-s": "vit_small_patch16_224"}
TIMM_ROW = "timm"


def _build_timm(spec: BenchSpec) -> tuple[torch.nn.Module, int]:
    """timm's ViT of the same shape, built without weights (nothing is downloaded)."""
    if spec.model not in TIMM_MODELS:
        raise ValueError(f"no timm reference for --model {spec.model}; it has one for {', '.join(TIMM_MODELS)}")
    try:
        import timm
    except ImportError as error:
        raise ImportError("the timm reference row needs timm: pip install timm") from error
    size = spec.image_size or MODELS[spec.model][1]
    model = timm.create_model(TIMM_MODELS[spec.model], pretrained=False, num_classes=1000, img_size=size)
    return model.eval().to(spec.device), size


def _build_vit(method: str, spec: BenchSpec) -> tuple[torch.nn.Module, int]:
    from pe_bench.harness.grid.methods import parse_method

    if method == TIMM_ROW:
        return _build_timm(spec)
    config, default_size = MODELS[spec.model]
    size = spec.image_size or default_size
    parsed = parse_method(method)
    make_encoding = EncodingFactory(parsed.name, dict(parsed.options))
    model = ViT(make_encoding, image_geometry((size, size), config.patch_size), config, 3, 1000)
    set_attention_kernel(model, spec.attention_kernel)
    if spec.compile:
        model.compile()
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
        # Counted on the dense path: the counters are dispatch modes, inside which a compiled
        # Flex kernel cannot run (and eager Flex has no backward on CPU); the same arithmetic.
        with attention_kernel("dense"):
            row["gflops_per_image"] = round(flops_per_image(models[method], size, spec.device) / 1e9, 4)
        row["peak_mib"] = memory[method]
        row["mem_vs_nopos"] = None if not memory["nopos"] or memory[method] is None else round(
            memory[method] / memory["nopos"], 3
        )  # fmt: skip
        row["pos_params"] = _positional_parameters(models[method])
        row["params"] = sum(p.numel() for p in models[method].parameters())
        row["sdpa"] = sdpa_backend(models[method], first, spec.device)
        if not spec.compile:  # a compiled model runs fused kernels, not these operators
            with _autocast(spec.device), attention_kernel("dense"):
                row["ops_fwd"], row["ops_train"] = operators_per_pass(models[method], first[:1])
            if spec.train_batch:
                with attention_kernel("dense"):
                    row[f"written_mib_train_b{spec.train_batch}_bf16"] = bf16_mib_written(models[method], size, spec)
        rows.append(row)
    return pd.DataFrame(rows).set_index("method")


def bf16_mib_written(model: torch.nn.Module, size: int, spec: BenchSpec) -> float:
    """MiB one bf16-autocast training step at ``spec.train_batch`` writes (``op_count.py``):
    the setting GPU runs train in, also on CPU (CPU autocast's cast lists, close to CUDA's)."""
    images = torch.randn(spec.train_batch, 3, size, size, device=spec.device)
    with torch.autocast(torch.device(spec.device).type, dtype=torch.bfloat16):
        return round(bytes_written_per_step(model, images) / 2**20, 1)


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


def _cuda_peak_mib(call: Callable[[], object]) -> float:
    """The CUDA allocator's peak during ``call()`` above what was allocated before it (MiB)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def vit_peak_memory(method: str, spec: BenchSpec) -> float | None:
    """Peak memory (MiB) of one inference forward of the whole ViT: CUDA allocator peak, or on
    CPU the peak RSS of a fresh subprocess above bare torch (weights and input included)."""
    if spec.device.startswith("cuda"):
        model, size = _build_vit(method, spec)
        images = torch.randn(spec.batches[0], 3, size, size, device=spec.device)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            return round(_cuda_peak_mib(lambda: model(images)), 1)
    args = f"{method!r}, {spec.model!r}, {spec.batches[0]}, {spec.image_size!r}, {spec.attention_kernel!r}"
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


def _vit_memory_child(method: str, model_name: str, batch: int, image_size: int | None, kernel: str = "auto") -> float:
    """Peak RSS of building the model and running one forward, above the bare torch process.
    (Measured from the start: freed pages are reused, so a delta around the forward alone
    would hide everything below the high-water mark that construction left.)"""
    torch.set_num_threads(1)
    baseline = _peak_rss_mib()
    spec = BenchSpec(model=model_name, batches=(batch,), image_size=image_size, attention_kernel=kernel)
    model, size = _build_vit(method, spec)
    with torch.inference_mode():
        model(torch.randn(batch, 3, size, size))
    return _peak_rss_mib() - baseline


def _child_failure(stderr: str, returncode: int) -> str:
    """A failed subprocess measurement as a table cell, as ``_failure`` writes an exception's:
    "OOM" for the allocator's error (CPU or CUDA, or the kernel's OOM killer), else
    "error: " and the error's last line, e.g. "CUDA error: invalid argument"."""
    if "OutOfMemoryError" in stderr or "out of memory" in stderr.lower() or returncode == -9:
        return "OOM"
    last = (stderr.strip().splitlines() or [f"exit status {returncode}"])[-1]
    return f"error: {last[:80]}"


def _run_child(code: str) -> tuple[str | None, str]:
    """Runs ``code`` in a fresh Python (so a failure, or the memory it reached, stays there):
    its last stdout line, or None and the reason it failed."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None, _child_failure(proc.stderr, proc.returncode)
    return proc.stdout.strip().splitlines()[-1], ""


def _in_subprocess(code: str) -> str | None:
    result, reason = _run_child(code)
    if result is None:
        # The point stays empty in the table; say why rather than hide it.
        print(f"bench: a measurement subprocess failed: {reason}", file=sys.stderr)
    return result


def _attention_layer(
    method: str, tokens: int, dim: int, heads: int, device: str = "cpu", kernel: str = "auto"
) -> tuple[Attention, torch.Tensor, PositionLayout]:
    from pe_bench.harness.grid.methods import parse_method

    side = max(int(math.isqrt(tokens)), 1)
    parsed = parse_method(method)
    geometry = Geometry(pos_dim=2, grid_shape=(side, side), num_prefix_tokens=0)
    encoding = build_encoding(parsed.name, geometry, dim, heads, 1, dict(parsed.options)).to(device)
    layer = set_attention_kernel(Attention(dim, heads, encoding.make_layer(0)).eval().to(device), kernel)
    layout = encoding.prepare(PositionLayout.grid(1, (side, side), device=device))
    x = encoding.embed(torch.randn(1, side * side, dim, device=device), layout)
    return layer, x, layout


def _peak_memory_child(
    method: str, tokens: int, dim: int, heads: int, device: str = "cpu", kernel: str = "auto"
) -> dict:
    """Runs in a subprocess: the time and peak memory of one attention layer's forward.

    CPU (fp32, one thread): peak RSS above the bare torch process of building the layer with
    its inputs and running one forward, and that forward's time. CUDA (bf16 autocast): after
    one warm-up forward (FlexAttention compiles its kernel there), the mean time of 5 forwards
    and the allocator's peak during them above what was allocated before (weights and input
    excluded)."""
    if not device.startswith("cuda"):
        torch.set_num_threads(1)
        baseline = _peak_rss_mib()
        with torch.inference_mode():
            layer, x, layout = _attention_layer(method, tokens, dim, heads, kernel=kernel)
            start = time.perf_counter()
            layer(x, layout)
            elapsed = time.perf_counter() - start
        return {"peak_mib": _peak_rss_mib() - baseline, "ms": elapsed * 1000}
    repeats = 5
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed_forwards() -> None:
        start.record()
        for _ in range(repeats):
            layer(x, layout)
        end.record()

    with torch.inference_mode(), _autocast(device):
        layer, x, layout = _attention_layer(method, tokens, dim, heads, device, kernel)
        layer(x, layout)
        peak = _cuda_peak_mib(timed_forwards)
    return {"peak_mib": peak, "ms": start.elapsed_time(end) / repeats}


EXPLICIT_BUDGET = 4 * 2**30

#: ``--sweep``'s encodings: on CPU the bias encodings build their dense N x N bias (the
#: reference path), which past a few thousand tokens only measures the machine's memory; on
#: CUDA they run on FlexAttention, and the sweep shows their memory staying linear.
SWEEP_METHODS = {
    "cpu": "nopos,rope,pape,pape[form=explicit]",
    "cuda": "nopos,rope,rope-mixed,pape,alibi,lookhere,relpos,sape2,pape[form=explicit]",
}


def _explicit_pape_bytes(method: str, tokens: int, heads: int) -> float:
    from pe_bench.harness.grid.methods import parse_method

    spec = parse_method(method)
    options = dict(spec.options)
    if not spec.name.startswith("pape") or options.get("form") != "explicit":
        return 0.0
    m = options.get("m", 50)
    return 4.0 * tokens * tokens * heads * (m + 2)


def sweep_table(
    methods: list[str],
    token_counts: list[int],
    dim: int = 768,
    heads: int = 12,
    device: str = "cpu",
    on_row: Callable[[dict], None] | None = None,
    kernel: str = "auto",
) -> pd.DataFrame:
    """Time (ms) and peak memory (MiB) of one attention layer as the token count grows, one
    row per (tokens, method) with its ``status``: "ok", "skipped: ..." or the failure ("OOM",
    "error: ..." with a kernel's message), which is a result here, not a crash. Every point runs
    in a fresh process (see ``_peak_memory_child`` for what is measured per device);
    ``on_row`` sees each row as soon as it is measured; ``kernel`` is the bias encodings'."""
    rows: list[dict] = []
    report = on_row or (lambda row: None)
    # whether the bias encodings' points run dense (auto on CUDA counts as Flex here: a
    # dense bias past EXPLICIT_BUDGET is far above auto's small-bias threshold)
    dense = not wants_flex(torch.device(device), kernel)
    for tokens in token_counts:
        for method in methods:
            row: dict[str, object] = {"tokens": tokens, "method": method, "peak_mib": None, "ms": None}
            if dense and _explicit_pape_bytes(method, tokens, heads) > EXPLICIT_BUDGET:
                # The dense Eq. 9 bias holds a (B, H, N, N, m) tensor: past a few GiB it would
                # only exhaust the machine; the row shows where the efficient form keeps going.
                # (Flex, CUDA's default kernel, evaluates it without the tensor: not skipped there.)
                rows.append({**row, "status": f"skipped: dense bias > {EXPLICIT_BUDGET / 2**30:.0f} GiB"})
                report(rows[-1])
                continue
            code = (
                "import json; from pe_bench.harness.reports.bench import _peak_memory_child as f;"
                f"print(json.dumps(f({method!r}, {tokens}, {dim}, {heads}, {device!r}, {kernel!r})))"
            )
            result, reason = _run_child(code)
            if result is None:
                rows.append({**row, "status": reason})
            else:
                measured = json.loads(result)
                peak, ms = round(measured["peak_mib"], 1), round(measured["ms"], 2)
                rows.append({**row, "peak_mib": peak, "ms": ms, "status": "ok"})
            report(rows[-1])
    return pd.DataFrame(rows)


def sweep_markdown(sweep: pd.DataFrame) -> str:
    """``sweep_table`` as tokens x method, each cell "MiB / ms" or why there is no measurement."""

    def cell(row: pd.Series) -> str:
        if row["status"] != "ok":
            return str(row["status"])
        return f"{row['peak_mib']:,.0f} MiB / {row['ms']:,.1f} ms"

    cells = sweep.assign(cell=sweep.apply(cell, axis=1))
    order = list(dict.fromkeys(sweep["method"]))
    return cells.pivot(index="tokens", columns="method", values="cell")[order].to_markdown()


def header() -> str:
    import lightning

    from pe_bench.harness.grid.store import device_description

    return (
        f"device: {device_description()} | torch {torch.__version__} | lightning {lightning.__version__} "
        f"| python {sys.version.split()[0]}"
    )


# --- PaPE's widened q/k in 16-bit: softmax accuracy against float64 ---------------------

#: frame_tile of the table's tiled variant: 4 x 4 queries per frame.
PRECISION_TILE = 4
#: (column label, encoding options, autocast dtype or None) of ``pape_precision_table``;
#: an encoding without an option a variant sets gets plain autocast in that column.
PRECISION_VARIANTS = (
    ("float32", {}, None),
    ("bf16 round", {"low_precision": "round"}, torch.bfloat16),
    ("bf16 split", {"low_precision": "split"}, torch.bfloat16),
    ("bf16 tiles", {"low_precision": "round", "frame_tile": PRECISION_TILE}, torch.bfloat16),
)


def _query_groups(layer: Attention, x: torch.Tensor, layout: PositionLayout, rows: torch.Tensor, autocast):
    """(query indices, q, k, v) per group of the sampled ``rows`` that the layer's encoding
    transforms together (``frame_tile``), one group at a time: q and k are projected again
    for every group, so that each group's graph (and its keys' widened features, one copy
    per group) is freed before the next."""
    context = torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None)
    with context:
        q, k, v, inputs = layer._raw_heads(x, layout, None, None, False)
        groups = layer.query_groups(inputs)
        if groups is None:
            q, k = layer.transform(q, k, inputs)
    if groups is None:
        yield rows, q[:, :, rows], k, v
        return
    sampled = torch.zeros(x.shape[1], dtype=torch.bool)
    sampled[rows] = True
    for group_rows in groups:
        chosen = group_rows[sampled[group_rows]]
        if len(chosen):
            with context:
                q, k, v, inputs = layer._raw_heads(x, layout, None, None, False)
                group = layer.transform_group(q, k, inputs, chosen)
            yield chosen, group.q, group.k, v


def _attention_probabilities(layer: Attention, x: torch.Tensor, layout: PositionLayout, rows: torch.Tensor, autocast):
    """Softmax of the widened-q/k logits of the query ``rows``, as an attention kernel forms
    them: products of the (possibly 16-bit) features exact, sums wide (here float64). Each
    group of queries (``frame_tile``) with its own keys' features."""
    out = torch.empty(1, layer.num_heads, x.shape[1], x.shape[1], dtype=torch.float64)
    with torch.no_grad():
        for query_ids, q, k, _ in _query_groups(layer, x, layout, rows, autocast):
            logits = q.double() @ k.double().transpose(-1, -2) / math.sqrt(layer.head_dim)
            out[:, :, query_ids] = logits.softmax(-1)
    return out[:, :, rows]


def _kernel_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, upstream: torch.Tensor, scale: float):
    """dL/dq and dL/dk of L = <softmax(q k^T scale) v, upstream>, with the roundings of a
    FlashAttention-style 16-bit backward: P rounded to 16 bits for P V, dS = P (dP - D)
    rounded to 16 bits for the dS k and dS^T q products (exact products, wide sums), dq and
    dk returned in q's dtype. For float32 and float64 q, plain autograd.

    This is a model of the kernel's arithmetic, not a GPU measurement: FlashAttention-2 (and
    the memory-efficient and cuDNN kernels, which feed the same tensor-core products) hold
    P and dS in the input dtype for their second-stage products."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        q_, k_ = q.detach().requires_grad_(), k.detach().requires_grad_()
        out = ((q_ @ k_.transpose(-1, -2)) * scale).softmax(-1) @ v.to(q.dtype)
        return torch.autograd.grad((out * upstream.to(q.dtype)).sum(), (q_, k_))
    low = q.dtype
    wide = lambda t: t.double()  # noqa: E731 (exact products of 16-bit numbers, wide sums)
    probabilities = ((wide(q) @ wide(k).transpose(-1, -2)) * scale).softmax(-1)
    out = wide(probabilities.to(low)) @ wide(v)
    d_out = wide(upstream.to(low))
    d_probabilities = d_out @ wide(v).transpose(-1, -2)
    d_scores = wide((probabilities * (d_probabilities - (d_out * out).sum(-1, keepdim=True))).to(low))
    return (d_scores @ wide(k) * scale).to(low), (d_scores.transpose(-1, -2) @ wide(q) * scale).to(low)


def _gradient_errors(layer: Attention, reference: Attention, x, layout, layout64, rows, autocast) -> dict[str, float]:
    """Relative L2 error, against ``reference`` (float64), of the gradients that flow through
    q and k for a loss on the query ``rows`` (fixed random upstream gradient): of the
    encoding's parameters ("positional", NaN without any) and of the qkv weight ("content")."""

    def gradients(attention: Attention, tokens, positions, cast) -> dict[str, torch.Tensor]:
        attention.zero_grad(set_to_none=True)
        n, scale = tokens.shape[1], 1.0 / math.sqrt(attention.head_dim)
        shape = (1, attention.num_heads, n, attention.head_dim)
        upstream = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        for query_ids, q, k, v in _query_groups(attention, tokens, positions, rows, cast):
            d_q, d_k = _kernel_gradients(q, k, v.detach(), upstream[:, :, query_ids], scale)
            torch.autograd.backward([q, k], [d_q, d_k])
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
    without that option get no such column).
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


# --- Throughput (img/s) per encoding, against nopos and against a FLOP-model bound ------

#: the encodings of the GPU table (issue 16), nopos first.
THROUGHPUT_METHODS = (
    "nopos", "sincos", "abspos", "cape", "rope", "rope-mixed", "string-cayley", "string-circulant",
    "alibi", "relpos", "lookhere", "cope", "sape2", "pape", "pape[m=8]", "pape-ri", "pape[form=explicit]",
)  # fmt: skip


def vit_forward_flops(config: ModelConfig, tokens: int, patch_dim: int, num_classes: int = 1000) -> float:
    """Forward FLOPs (multiply-add = 2) of one image through a ViT without position encoding:
    per layer the qkv/proj/MLP matmuls, N D^2 (8 + 4 mlp_ratio), and the attention's two
    N x N products, 4 N^2 D; plus the patch embedding and the head."""
    n, d = tokens, config.dim
    per_layer = n * d * d * (8 + 4 * config.mlp_ratio) + 4 * n * n * d
    return config.depth * per_layer + 2 * (n - 1) * patch_dim * d + 2 * d * num_classes


def _widened_channels(extra: int, pad_to: int, split: bool) -> int:
    """Extra q/k channels of PaPE's efficient forms after the hi/lo split and padding."""
    width = 3 * extra if split else extra
    return width + (-width % pad_to)


def encoding_flops(method: str, config: ModelConfig, tokens: int, pos_dim: int = 2, bf16: bool = True) -> float | None:
    """Forward FLOPs per image that ``method`` adds to a ViT (``vit_forward_flops``), by the
    encoding's action point; None for an encoding the model does not know.

    * embed (sincos, abspos, cape): one add per token channel, N D (plus CAPE/sincos
      features, a few per channel): 4 N D.
    * rotation of q and k (rope, rope-mixed, STRING) per layer: 3 per q/k channel (pairs:
      4 multiplies, 2 adds) on 2 N D channels, plus angles and cos/sin, ~ 2 N D: 8 N D.
      Both STRINGs add a basis change on q and k, a (E x E) product per token and head:
      4 N D E (Cayley's learned P; Circulant's fixed real Fourier basis, dense, whose
      block-diagonal zeros the matrix product multiplies too).
    * bias per layer, per head and (query, key) pair: ALiBi 3P + 3 (differences, squares,
      sqrt, slope), relpos 4P + 2 (round, clip, index), LookHere 3P + 8 (distance and the
      field-of-view test), PaPE explicit 5m + 2 (Eq. 9 with direct differences) plus its
      W_a/W_b/W_p projections. CoPE: the gate products again (2 E), sigmoid, suffix sums
      and interpolation, 2 E + 12; SaPE²: gates 2 E + 4, and Eq. 15's two distances over
      the W + H vector entries, 3 (W + H).
    * widened q/k (pape, pape-ri, efficient): q.k over the extra channels, 2 N^2 H w (v
      stays unpadded on CUDA), with w after the bf16 hi/lo split (3x, ``bf16``) and padding;
      plus the coefficient projections (PaPE: W_a, W_b: 4 N D H m; W_p: 2 N H m P; the
      features ~ 8 N H m; PaPE-RI: w_α, 2 N D H).

    Training costs about three forwards for every term alike, so the training bound is the
    same ratio. The bound ignores memory traffic, which is what elementwise work costs.
    """
    from pe_bench.harness.grid.methods import parse_method

    parsed = parse_method(method)
    options = dict(parsed.options)
    n, d, h, layers = tokens, config.dim, config.num_heads, config.depth
    e, p = d // h, pos_dim
    pairs = layers * h * n * n
    side = math.isqrt(max(n - 1, 1))
    if parsed.name == "nopos":
        return 0.0
    if parsed.name in ("sincos", "abspos", "cape", "wepe"):
        return 4.0 * n * d
    if parsed.name in ("rope", "rope-mixed"):
        return layers * 8.0 * n * d
    if parsed.name in ("string-cayley", "string-circulant"):
        return layers * (8.0 * n * d + 4.0 * n * d * e)
    if parsed.name == "alibi":
        return pairs * (3.0 * p + 3)
    if parsed.name == "relpos":
        return pairs * (4.0 * p + 2)
    if parsed.name == "lookhere":
        return pairs * (3.0 * p + 8)
    if parsed.name == "cope":
        return pairs * (2.0 * e + 12)
    if parsed.name == "sape2":
        return pairs * (2.0 * e + 4 + 3 * 2 * side)
    if parsed.name == "pape":
        m = int(options.get("m", 50)) if options.get("project", True) else p
        projections = layers * (4.0 * n * d * h * m + 2.0 * n * h * m * p + 8.0 * n * h * m)
        if options.get("form", "efficient") == "explicit":
            return projections + pairs * (5.0 * m + 2)
        split = bf16 and options.get("low_precision", "split") == "split"
        widened = _widened_channels(1 + 2 * m, int(options.get("pad_to", 8)), split)
        return projections + layers * 2.0 * n * n * h * widened
    if parsed.name == "pape-ri":
        projections = layers * 2.0 * n * d * h
        if options.get("form", "efficient") == "explicit":
            return projections + pairs * (3.0 * p + 4)
        split = bf16 and options.get("low_precision", "split") == "split"
        widened = _widened_channels(p + 2, int(options.get("pad_to", 8)), split)
        return projections + layers * 2.0 * n * n * h * widened
    return None


def flop_bound(method: str, config: ModelConfig, image_size: int, bf16: bool = True) -> float | None:
    """The FLOP model's time ratio of ``method`` to nopos on a ViT: the best it can do."""
    side = image_size // config.patch_size
    tokens = side * side + 1
    base = vit_forward_flops(config, tokens, 3 * config.patch_size**2)
    extra = encoding_flops(method, config, tokens, 2, bf16)
    return None if extra is None else (base + extra) / base


def attention_kernels(model: torch.nn.Module, images: torch.Tensor, device: str) -> str:
    """The attention kernels the model runs: FLEX (FlexAttention) and/or SDPA's choices."""
    from pe_bench.harness import attention as attention_module

    real = attention_module.flex_attention_with_masks
    used_flex = []

    def spy(*args, **kwargs):
        used_flex.append(True)
        return real(*args, **kwargs)

    attention_module.flex_attention_with_masks = spy
    try:
        sdpa = sdpa_backend(model, images, device)
    finally:
        attention_module.flex_attention_with_masks = real
    if not used_flex:
        return sdpa
    return "FLEX" if sdpa.startswith("none") else f"FLEX+{sdpa}"


def _failure(error: BaseException) -> str:
    """How a failed measurement appears in the table (out of memory, kernel errors, ...)."""
    if isinstance(error, torch.OutOfMemoryError):
        return "OOM"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return f"error: {' '.join(lines[:2])[:80]}"  # pydantic names the bad key on line 2


@dataclass
class _Baseline:
    """nopos's measuring jobs, alive through the whole img/s table so that every other row's
    timed calls alternate with nopos calls (``paired.py``), and every nopos call timed on
    the way; by column (``train_img_s_b128``, ...)."""

    jobs: dict[str, Callable[[], None]] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def over_the_run(self, column: str, batch: int) -> dict[str, float]:
        """nopos's img/s over all its timed calls of the run (median, 10th and 90th
        percentiles, number of calls): how steady the machine was while the table ran."""
        seconds = self.seconds[column]
        deciles = statistics.quantiles(seconds, n=10, method="inclusive") if len(seconds) > 1 else seconds * 9
        return {  # the slowest calls (90th percentile of time) are the 10th percentile of img/s
            "median": round(batch / statistics.median(seconds), 1),
            "p10": round(batch / deciles[-1], 1),
            "p90": round(batch / deciles[0], 1),
            "calls": len(seconds),
        }


def _measure_method(
    method: str, spec: BenchSpec, baseline: _Baseline | None
) -> tuple[dict[str, object], dict[str, tuple[Callable[[], None], PairedTiming]]]:
    """img/s of training and inference at every batch of ``spec``, every timed call right
    after one of nopos's (``baseline``; None while measuring nopos itself), with the median
    of the per-pair time ratios (``_vs_nopos``) and their IQR; peak memory of the largest
    training batch (this method's own, from the CUDA allocator; None on CPU) and the
    kernels; failures as text. Returns the row and, per column that ran, the job and its
    timing (nopos's become the baseline)."""
    row: dict[str, object] = {"method": method}
    cuda = spec.device.startswith("cuda")
    resident = torch.cuda.memory_allocated() if cuda else 0  # nopos's jobs, while measuring another
    try:
        model, size = _build_vit(method, BenchSpec(**{**spec.__dict__, "compile": False}))
        images = torch.randn(1, 3, size, size, device=spec.device)
        # timm's attention is not ours to spy on: its row names the model instead
        row["kernel"] = TIMM_MODELS[spec.model] if method == TIMM_ROW else attention_kernels(model, images, spec.device)
        if spec.compile:
            model.compile()
    except Exception as error:  # a method that cannot even be built is one row of the table
        row["kernel"] = _failure(error)
        return row, {}
    ran: dict[str, tuple[Callable[[], None], PairedTiming]] = {}
    # the largest batch first, so that its training peak holds no smaller batch's optimiser
    # state (the jobs that ran stay alive: nopos's are the baseline)
    for batch in sorted(spec.batches, reverse=True):
        images = torch.randn(batch, 3, size, size, device=spec.device)
        jobs = {
            "train": _TrainStep(model, images, spec.device),
            "infer": lambda x=images: _inference(model, x, spec.device),
        }
        for mode, job in jobs.items():
            column = f"{mode}_img_s_b{batch}"
            peak = mode == "train" and batch == max(spec.batches)
            if peak:
                row["train_peak_mib"] = None
            try:
                job()  # two warm-up calls: compilation, allocator, autotuning
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                job()
                if peak and cuda:  # read now: the timed calls alternate with nopos's
                    row["train_peak_mib"] = round((torch.cuda.max_memory_allocated() - resident) / 2**20, 1)
                reference = None if baseline is None else baseline.jobs.get(column)
                timing = paired_timing(job, reference, spec.repeats, spec.threads)
            except Exception as error:  # OOM, a kernel that refuses the shapes, ...
                row[column] = _failure(error)
                continue
            row[column] = round(batch / timing.median_seconds, 1)
            if reference is not None:
                row[f"{column}_vs_nopos"] = round(timing.slowdown, 3)
                row[f"{column}_vs_nopos_iqr"] = round(timing.slowdown_iqr, 3)
                baseline.seconds[column] += timing.reference_seconds
            ran[column] = (job, timing)
    return row, ran


def throughput_table(spec: BenchSpec, on_row: Callable[[dict], None] | None = None) -> pd.DataFrame:
    """Per encoding: training and inference img/s at each batch of ``spec`` (bf16 autocast on
    CUDA), how many times slower than nopos (``_vs_nopos``, the issue's "nopos / this"; the
    median over pairs of one nopos call and one of the encoding's, ``_vs_nopos_iqr`` their
    spread), that over the FLOP model's bound (``_vs_bound``, 1.0 = as fast as its arithmetic
    allows), peak training memory at the largest batch, and the attention kernels used. A
    measurement that fails (out of memory, kernel error) shows as text in its cell.

    nopos is measured first and its model stays; every other encoding is built, measured and
    freed in turn (a ViT-B table needs two models' memory), its timed calls alternating with
    nopos calls, so drift of the machine during a long table cancels in the ratios; nopos's
    img/s over all its calls of the run is in ``table.attrs["nopos_over_the_run"]``. ``on_row``
    sees each row as soon as it is measured (a long GPU run killed at its time limit still
    leaves the rows it finished). The method ``timm`` is timm's ViT of the same shape
    (``TIMM_MODELS``), the reference that nopos should match or beat.
    """
    methods = list(dict.fromkeys(("nopos", *spec.methods)))
    config, default_size = MODELS[spec.model]
    size = spec.image_size or default_size
    rows, baseline = [], None
    # past Dynamo's recompile limit a compiled Flex kernel would silently run eagerly (unfused):
    # a slow number that looks like the kernel's; make it the row's error instead
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for method in methods:
            row, ran = _measure_method(method, spec, baseline)
            if baseline is None:  # nopos: every later call pairs with its jobs
                jobs = {column: job for column, (job, _) in ran.items()}
                baseline = _Baseline(jobs, {column: list(timing.seconds) for column, (_, timing) in ran.items()})
                row.update({f"{column}_vs_nopos": 1.0 for column in ran})
            rows.append(row)
            if on_row is not None:
                on_row(row)
            if spec.device.startswith("cuda"):
                torch.cuda.empty_cache()
    table = pd.DataFrame(rows).set_index("method")
    built = [not str(kernel).startswith(("error:", "OOM")) for kernel in table["kernel"]]
    bf16 = spec.device.startswith("cuda")
    bounds = [
        flop_bound(m, config, size, bf16) if ok and m != TIMM_ROW else None
        for m, ok in zip(table.index, built, strict=True)
    ]
    table["flop_bound"] = [None if b is None else round(b, 3) for b in bounds]
    for batch in spec.batches:
        for mode in ("train", "infer"):
            column = f"{mode}_img_s_b{batch}"
            ratio_column = f"{column}_vs_nopos"
            if ratio_column not in table:  # nopos failed here: nothing to compare with
                table[ratio_column] = None
            table[f"{column}_vs_bound"] = [
                None if pd.isna(r) or b is None else round(r / b, 3)
                for r, b in zip(table[ratio_column], bounds, strict=True)
            ]
    prefixes = [f"{mode}_img_s_b{b}" for b in spec.batches for mode in ("train", "infer")]
    measured = [c for prefix in prefixes for c in table if c.startswith(prefix)]
    order = ["kernel", "flop_bound", *measured, "train_peak_mib"]
    table = table[[c for c in order if c in table]]
    if baseline is not None:
        table.attrs["nopos_over_the_run"] = {
            column: baseline.over_the_run(column, int(column.rsplit("_b", 1)[1])) for column in baseline.seconds
        }
    return table


def profile_step(method: str, spec: BenchSpec, batch: int, steps: int = 3, rows: int = 25) -> str:
    """Where a training step's time goes: ``torch.profiler``'s operators of ``steps`` steps
    at ``batch`` (after two warm-up steps), the ``rows`` most expensive by self time on the
    device (CUDA time on a GPU). Issue 16's eager encodings cost several times their FLOP
    bound on an H200; this table names the operators that do it."""
    from torch.profiler import ProfilerActivity, profile

    model, size = _build_vit(method, spec)
    step = _TrainStep(model, torch.randn(batch, 3, size, size, device=spec.device), spec.device)
    step()
    step()
    cuda = spec.device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return profiler.key_averages().table(sort_by=key, row_limit=rows)
