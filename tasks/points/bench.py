"""``pe-bench bench --task modelnet40|scannet``: the PTv3 backbone's own figures.

The evaluation forward of one scene at 10k and 100k points (tiny and paper profiles), and
with ``--compile`` whether ``trainer.compile`` pays on these backbones: a training step of
the paper backbone (rope; bf16 autocast on CUDA) eager, compiled block by block (what
``trainer.compile`` does for them, ``harness/compile.py``) and compiled whole (dozens of
graphs split at the data-dependent sizes), each timed after warm-up steps that compile it.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch._dynamo.utils import counters  # Dynamo's graph counts

from pe_bench.adapters import EncodingFactory
from pe_bench.adapters._flex import raise_recompile_limit
from pe_bench.adapters._fused import with_inductor_options
from pe_bench.harness.compile import BLOCK_RECOMPILE_LIMIT, compile_model
from pe_bench.harness.config import load_run_config

from .ptv3 import PointBatch

SIZES = (10_000, 100_000)
PROFILES = ("tiny", "paper")
#: training steps (each on another point count) before timing: a variant compiled whole
#: was measured still compiling new graphs at its third step (62, 73, 76 graphs, then 76)
WARMUP_STEPS = 4
#: timed steps (their median), each on yet another point count, as in training
TIMED_STEPS = 3


def backbone_figures(task_cls, device: str, compile: bool) -> str:
    """Markdown: forward times, and with ``compile`` the training-step comparison."""
    sections = [forward_table(task_cls, device)]
    if compile:
        sections.append(compile_table(task_cls, device))
    return "\n\n".join(sections)


def forward_table(task_cls, device: str) -> str:
    rows = ["| profile | points | parameters | forward (s) |", "|---|---:|---:|---:|"]
    for profile in PROFILES:
        task = task_cls(load_run_config(task_cls.name, profile))
        torch.manual_seed(0)
        model = task.backbone(EncodingFactory("nopos")).eval().to(device)
        params = sum(p.numel() for p in model.parameters())
        for n in SIZES:
            points = random_scene(n, task.data.grid_size, 3 * len(task.data.feat_keys), device)
            with torch.inference_mode():
                model(points)  # warm-up (allocator, neighbour-table code paths)
                seconds = _timed(device, model, points)
            rows.append(f"| {profile} | {n} | {params / 1e6:.2f}M | {seconds:.3f} |")
    threads = torch.get_num_threads()
    head = f"PTv3 {task_cls.mode} backbone, eval forward of one scene, nopos, {device}, {threads} threads:"
    return "\n".join([head, "", *rows])


VARIANTS = ("eager", "per block", "whole")


def compile_table(
    task_cls, device: str, sizes: tuple[int, ...] = SIZES, profile: str = "paper", variants: tuple[str, ...] = VARIANTS
) -> str:
    """Training-step seconds of the ``profile`` backbone with rope: eager, compiled per block,
    compiled whole, and the compiled variants' graph counts. A variant that fails (out of
    memory, a compiler error) shows its error in its cells."""
    task = task_cls(load_run_config(task_cls.name, profile))
    channels = 3 * len(task.data.feat_keys)
    backend = "inductor" if device.startswith("cuda") else "aot_eager"
    rows = [
        f"| variant | graphs | {' | '.join(f'train step (s), {n} points' for n in sizes)} |",
        f"|---|---:|{'---:|' * len(sizes)}",
    ]
    for variant in variants:
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = task.backbone(EncodingFactory("rope")).train().to(device)
        if variant == "per block":  # what trainer.compile does
            compile_model(model, backend=backend)
        elif variant == "whole":  # with the same recompile limit, so that it too stays compiled
            raise_recompile_limit(BLOCK_RECOMPILE_LIMIT)
            model.compile(**with_inductor_options({"backend": backend}))
        times = []
        for n in sizes:
            try:
                times.append(_median_step_seconds(model, n, task.data.grid_size, channels, device))
            except Exception as error:  # noqa: BLE001  (a failed variant is a table entry)
                times.append(f"error: {str(error).splitlines()[0][:60]}")
        graphs = counters["stats"]["unique_graphs"]
        rows.append(f"| {variant} | {graphs} | {' | '.join(times)} |")
        # as measured, to stderr: a run stopped at a time limit keeps the variants it finished
        print(f"measured: {rows[-1]}", file=sys.stderr, flush=True)
        model = None  # free its memory before the next variant
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    how = "bf16 autocast, inductor" if backend == "inductor" else "fp32, aot_eager (on CPU: graph counts, not speed)"
    head = (
        f"PTv3 {task_cls.mode} backbone ({profile} profile), training step with rope, {device}, {how},"
        f" median of {TIMED_STEPS} steps after {WARMUP_STEPS} warm-up steps, every step on another point count:"
    )
    return "\n".join([head, "", *rows])


def _median_step_seconds(model: nn.Module, n: int, grid_size: float, channels: int, device: str) -> str:
    """Median seconds of TIMED_STEPS training steps after WARMUP_STEPS, each step on a scene of
    its own point count near ``n``; "(recompiled)" when a timed step still compiled a graph."""
    steps = WARMUP_STEPS + TIMED_STEPS
    scenes = [random_scene(n + 17 * i, grid_size, channels, device) for i in range(steps)]
    for scene in scenes[:WARMUP_STEPS]:
        _training_step(model, scene, device)
    graphs = counters["stats"]["unique_graphs"]
    seconds = sorted(_timed(device, _training_step, model, scene, device) for scene in scenes[WARMUP_STEPS:])
    recompiled = " (recompiled)" if counters["stats"]["unique_graphs"] != graphs else ""
    return f"{seconds[len(seconds) // 2]:.3f}{recompiled}"


def _training_step(model: nn.Module, points: PointBatch, device: str) -> None:
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else contextlib.nullcontext()
    with autocast:
        out = model(points)
    out.float().square().mean().backward()
    model.zero_grad(set_to_none=True)


def _timed(device: str, step: Callable[..., object], *args: object) -> float:
    _sync(device)
    start = time.perf_counter()
    step(*args)
    _sync(device)
    return time.perf_counter() - start


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def random_scene(n: int, grid_size: float, channels: int, device: str) -> PointBatch:
    """n points on distinct voxels of a room-sized surface-like slab."""
    side = int(np.ceil(np.sqrt(n * 2)))
    flat = torch.randperm(side * side * 4)[:n]
    grid = torch.stack([flat // (side * 4), (flat // 4) % side, flat % 4], dim=1)
    coord = grid.float() * grid_size
    return PointBatch(
        coord.to(device), grid.to(device), torch.zeros(n, dtype=torch.long, device=device),
        torch.randn(n, channels, device=device),
    )  # fmt: skip
