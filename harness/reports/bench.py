"""``pe-bench bench``: PaPE Table 4 per encoding (inference time per image at batch 1 and 32,
training-step time, peak memory, positional parameters, the SDPA kernel used), each relative
to ``nopos`` measured in the same run; and what the other tables of the command share: the
models (``_build_vit``), the jobs they time (``_inference``, ``_TrainStep``), the kernels a
model runs, peak memory in a fresh process, and the training step in ``torch.profiler``.
The command's other tables have their own modules: ``throughput.py`` (img/s against nopos
and the FLOP model), ``sweep.py`` (one layer as the token count grows), ``pape_precision.py``
(PaPE in 16-bit).

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
eager step's memory-bound elementwise work at large batches; ``host_syncs_train`` the
times one training forward + backward at batch 1 makes the host wait for a GPU
(``host_sync.py``: ``.item()``, boolean masks, ``nonzero``, ...; 0 but for WePE's one
declared copy), each of which idles the GPU while the host queues work again. All count this device's
path (on CPU the bias encodings' dense bias and PaPE's zero-padded v). Peak
memory on CPU is the peak resident set of a fresh subprocess per point above the bare
interpreter with torch loaded (torch has no CPU allocator statistics), so it includes
weights and inputs; on CUDA it is
``max_memory_allocated`` during the forward.
"""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch.utils import benchmark
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from pe_bench.adapters import EncodingFactory
from pe_bench.adapters._flex import raise_recompile_limit
from pe_bench.adapters.base import positional_parameters
from pe_bench.harness.attention import attention_kernel, set_attention_kernel
from pe_bench.harness.compile import compile_model
from pe_bench.harness.config import ModelConfig
from pe_bench.harness.reports.compiled_attention import recording
from pe_bench.harness.reports.host_sync import host_syncs_per_step
from pe_bench.harness.reports.op_count import bytes_written_per_step, operators_per_pass
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
        compile_for_bench(model)
    return model.eval().to(spec.device), size


#: Dynamo's compiled entries per code object that one bench process may hold: every model of
#: a table runs the same ViT code, each with entries per training/evaluation mode and batch
#: shape, and all stay alive (nopos is timed in pairs with every other row). Past Dynamo's
#: default of 8 (reached at the third model, measured) it would run later models uncompiled.
BENCH_RECOMPILE_LIMIT = 256


def compile_for_bench(model: torch.nn.Module) -> torch.nn.Module:
    """Compile ``model`` in place as ``trainer.compile`` does, without the fresh Dynamo state
    a training cell gets (the table's other compiled models must stay compiled) but with room
    for all of their entries; a table times under ``fail_on_recompile_limit_hit``, so a model
    that would still run uncompiled is an error, not an eager time under a compiled label.

    Static shapes (``dynamic=False``): Dynamo's automatic dynamic shapes are decided per code
    object, so once one model ran at two batch sizes, every later model's first compilation
    would be for any batch size (measured: the second model's batch-4 graph was compiled for
    2 <= batch <= 4096), and the table would compare nopos's batch-specialised kernels with
    generic ones of the other encodings. Each model gets a graph per batch it is timed at,
    as a training cell's fixed batch gets."""
    raise_recompile_limit(BENCH_RECOMPILE_LIMIT)
    return compile_model(model, dynamic=False)


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
    EFFICIENT_ATTENTION, MATH; MATH materialises the N x N logits), as one name or "a+b", in
    inference, followed by " (training: ...)" where a training forward picks others: a bias
    that requires grad (relpos' table, PaPE's positional bias form) is a different input to
    the choice (CPU's flash kernel takes none, so training there runs MATH)."""
    inference = _chosen_sdpa_kernels(lambda: _inference(model, images, device))
    training = _chosen_sdpa_kernels(lambda: _training_forward(model, images, device))
    return inference if training == inference else f"{inference} (training: {training})"


def _training_forward(model: torch.nn.Module, images: torch.Tensor, device: str) -> None:
    """One forward as a training step runs it (train mode, autograd recording); no backward.
    Eager even for a compiled model (``_chosen_sdpa_kernels``)."""
    try:
        with _autocast(device):
            model.train()(images)
    finally:
        model.eval()


def _chosen_sdpa_kernels(run: Callable[[], None]) -> str:
    from torch.nn.attention import SDPBackend

    from pe_bench.harness import attention as attention_module

    real = attention_module.F.scaled_dot_product_attention
    chosen: set[str] = set()

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        chosen.add(SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale)).name)
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

    attention_module.F.scaled_dot_product_attention = spy
    try:
        # eager even for a compiled model: the probe is not worth a compilation of its own, and
        # Dynamo cannot trace the spy (torch 2.14: an internal error building a guard on it,
        # which made every `bench --compile` forward table fail)
        with torch.compiler.set_stance("force_eager"):
            run()
    finally:
        attention_module.F.scaled_dot_product_attention = real
    return "+".join(sorted(chosen)) or "none (own attention)"


def failure_cell(error: BaseException) -> str:
    """How a failed measurement appears in a table (out of memory, kernel errors, ...): the
    cell says what happened where the figure would be, and the rest of the table stands."""
    if isinstance(error, torch.OutOfMemoryError):
        return "OOM"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return f"error: {' '.join(lines[:2])[:80]}"  # pydantic names the bad key on line 2


def _measured_or_failure(measure: Callable[..., object], *args: object) -> object:
    """``measure(*args)``, or its failure as a cell (``failure_cell``)."""
    try:
        return measure(*args)
    except Exception as error:  # OOM, a kernel that refuses the shapes, ...
        release_cuda_memory()
        return failure_cell(error)


def release_cuda_memory() -> None:
    """After an OOM the failed call's tensors are garbage, not yet freed: free them, so that the
    next measurement starts from what the living models hold, not from the failed peak."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


# a compiled model past Dynamo's recompile limit would run uncompiled, silently: an error instead
@torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
def forward_table(spec: BenchSpec) -> pd.DataFrame:
    """PaPE Table 4 and more, per method: inference time per image at each batch size, one
    training step, peak inference memory, positional parameters; each with its ratio to nopos
    measured in the same run. A measurement that fails (out of memory at the large batch, a
    kernel that refuses the shapes, a method that cannot be built) is a cell saying so
    (``failure_cell``); its ratio stays empty. Only nopos must build: every ratio is to it."""
    methods = list(dict.fromkeys(("nopos", *spec.methods)))
    models, unbuilt, size = {}, {}, None
    for method in methods:
        try:
            models[method], size = _build_vit(method, spec)
        except Exception as error:
            if method == "nopos":  # the model or image size itself is wrong: no table to make
                raise
            unbuilt[method] = failure_cell(error)
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
    failed: dict[tuple[str, str], str] = {}  # a job that failed once is not timed again
    with recording(spec.compile) as compiled:  # the kernels the compiled graphs run (``--compile``)
        for _ in range(spec.repeats):  # interleaved, so a noisy machine's drift hits every method alike
            for method in models:
                for column, _, job in jobs[method]:
                    if (method, column) in failed:
                        continue
                    timer = benchmark.Timer("job()", globals={"job": job}, num_threads=threads, label=column,
                                            sub_label=method)  # fmt: skip
                    with compiled.attributing(f"{method}:{column.split('_', 1)[0]}"):  # train / infer
                        outcome = _measured_or_failure(timer.timeit, 1)
                    if isinstance(outcome, str):
                        failed[(method, column)] = outcome
                        samples.pop((method, column), None)
                    else:
                        samples.setdefault((method, column), []).append(outcome)
    times = {key: benchmark.Measurement.merge(measured)[0] for key, measured in samples.items()}
    memory = {m: _measured_or_failure(vit_peak_memory, m, spec) for m in models}
    first = inputs[spec.batches[0]]
    low = torch.bfloat16 if spec.device.startswith("cuda") else None  # as the timed passes run
    rows = []
    for method in methods:
        row: dict[str, object] = {"method": method}
        if method in unbuilt:
            row["sdpa"] = unbuilt[method]
            rows.append(row)
            continue
        model = models[method]
        for column, per_call, _ in jobs[method]:
            if (method, column) in failed:
                row[column] = failed[(method, column)]
                continue
            measured, reference = times[(method, column)], times.get(("nopos", column))
            row[column] = round(measured.median * 1000 / per_call, 3)
            row[f"{column}_iqr"] = round(measured.iqr * 1000 / per_call, 3)
            row[f"{column}_vs_nopos"] = None if reference is None else round(measured.median / reference.median, 3)
        # Counted on the dense path: the counters are dispatch modes, inside which a compiled
        # Flex kernel cannot run (and eager Flex has no backward on CPU); the same arithmetic.
        with attention_kernel("dense"):
            flops = _measured_or_failure(flops_per_image, model, size, spec.device, low)
        row["gflops_per_image"] = round(flops / 1e9, 4) if isinstance(flops, int) else flops
        row["peak_mib"] = memory[method]
        numbers = all(isinstance(memory[m], float) for m in ("nopos", method))
        row["mem_vs_nopos"] = round(memory[method] / memory["nopos"], 3) if numbers and memory["nopos"] else None
        row["pos_params"] = _positional_parameters(model)
        row["params"] = sum(p.numel() for p in model.parameters())
        row["sdpa"] = _measured_or_failure(sdpa_backend, model, first, spec.device)
        if spec.compile:  # the kernel its compiled graphs call; and no operator counts: it runs fused kernels
            row["sdpa"] = compiled.column(method, row["sdpa"])
        else:
            with attention_kernel("dense"):
                operators = _measured_or_failure(_operator_columns, model, first[:1], size, low, spec)
                row.update(operators if isinstance(operators, dict) else {"ops_fwd": operators})
        rows.append(row)
    return pd.DataFrame(rows).set_index("method")


def _operator_columns(model, image, size: int, low: torch.dtype | None, spec: BenchSpec) -> dict[str, object]:
    """The machine-independent columns of an eager model (operators, host syncs, MiB written);
    one failure fails them all, as they run the same passes."""
    columns: dict[str, object] = {}
    columns["ops_fwd"], columns["ops_train"] = operators_per_pass(model, image, low)
    columns["host_syncs_train"] = len(host_syncs_per_step(model, image).syncs)
    if spec.train_batch:
        columns[f"written_mib_train_b{spec.train_batch}_bf16"] = bf16_mib_written(model, size, spec)
    return columns


def bf16_mib_written(model: torch.nn.Module, size: int, spec: BenchSpec) -> float:
    """MiB one bf16-autocast training step at ``spec.train_batch`` writes (``op_count.py``):
    the setting GPU runs train in, also on CPU (CPU autocast's cast lists, close to CUDA's)."""
    images = torch.randn(spec.train_batch, 3, size, size, device=spec.device)
    return round(bytes_written_per_step(model, images, torch.bfloat16) / 2**20, 1)


def _cpu_flash_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# The CPU kernel of fused attention, which FlopCounterMode does not know (it counts the CUDA ones).
_EXTRA_FLOP_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_attention_flops}


def flops_per_image(model: torch.nn.Module, size: int, device: str, autocast: torch.dtype | None = None) -> int:
    """FLOPs of one inference forward of one image (FlopCounterMode: matmuls, convolutions,
    attention), under ``autocast`` to that dtype where given: the setting the timed passes run
    in. It is not only the matmuls' dtype: in 16 bits PaPE's widened features carry the split
    (hi and lo columns), 1.33x the float32 count at ViT-Ti/16 224² (pape-ri 1.02x; every other
    encoding the same count, stop 63)."""
    images = torch.randn(1, 3, size, size, device=device)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    with (
        torch.inference_mode(),
        torch.autocast(device_type, dtype=autocast or torch.bfloat16, enabled=autocast is not None),
        FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOP_FORMULAS) as counter,
    ):
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
    """A failed subprocess measurement as a table cell, as ``failure_cell`` writes an exception's:
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


def header() -> str:
    import lightning

    from pe_bench.harness.grid.store import device_description

    return (
        f"device: {device_description()} | torch {torch.__version__} | lightning {lightning.__version__} "
        f"| python {sys.version.split()[0]}"
    )


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
