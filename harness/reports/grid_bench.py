"""``pe-bench bench --grid``: the wall time of one fixed tiny grid under each executor.

The same grid (the same cells, seeds and overrides) runs once sequentially (``--jobs 1``),
once with ``--jobs N`` and, when Ray is installed, once on a local Ray cluster, each into a
fresh results folder and each as its own ``pe-bench run`` process, so that process start-up
and the executor's own overhead are in the figures as a user meets them. The figures are
ratios against the sequential run of the same invocation: absolute seconds on a shared
machine are noise, ratios measured back to back much less so.

Before timing, one short cell of every task generates and caches the tiny data, so that the
first timed run does not pay for it alone. Every run must finish every cell; the largest score
difference against the sequential run is reported (cells use fewer CPU threads each when
several run at once, which may change the last digits of a score).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pe_bench.harness.grid import store


@dataclass(frozen=True)
class GridBenchSpec:
    """The fixed grid: small enough to time in minutes, large enough for N workers to share."""

    tasks: str = "imagenet,ucf101"
    methods: str = "nopos,rope,pape"
    seeds: str = "0"
    overrides: tuple[str, ...] = ("optim.epochs=3",)
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    ray: bool = True


def _command(spec: GridBenchSpec, out: Path, *extra: str) -> list[str]:
    sets = [arg for override in spec.overrides for arg in ("--set", override)]
    return [
        sys.executable, "-m", "pe_bench.harness.cli", "run", "--tasks", spec.tasks, "--methods", spec.methods,
        "--seeds", spec.seeds, "--out", str(out), "--no-progress", *sets, *extra,
    ]  # fmt: skip


def _ray_environment() -> dict[str, str]:
    """A throw-away local cluster: no usage report, no token authentication."""
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _timed_run(command: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(
            f"bench --grid: `{' '.join(command[2:])}` failed (exit {done.returncode}):\n"
            + (done.stdout[-2000:] + done.stderr[-2000:]).strip()
        )
    return seconds


def _scores(out: Path) -> dict[tuple[str, str, int], float]:
    records = store.load_records(out)
    failed = [f"{r.task}/{r.method}/seed{r.seed}: {r.status}" for r in records if r.status != "ok"]
    if failed:
        raise RuntimeError("bench --grid: cells did not finish: " + "; ".join(failed))
    return {(r.task, r.method, r.seed): r.score for r in records}


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def grid_bench(spec: GridBenchSpec, say=print) -> pd.DataFrame:
    """Rows: sequential, ``--jobs N``, Ray; columns: wall seconds, cells, speed-up over the
    sequential run and the largest score difference to it."""
    runs: list[tuple[str, list[str], dict[str, str] | None]] = [
        ("--jobs 1", ["--jobs", "1"], None),
        (f"--jobs {spec.jobs}", ["--jobs", str(spec.jobs)], None),
    ]
    if spec.ray and ray_available():
        # ray.init() without an address starts a local cluster of every core it detects, not
        # of --jobs: the label says so rather than claim N CPUs.
        runs.append(("--executor ray (local cluster, all cores)", ["--executor", "ray"], _ray_environment()))
    elif spec.ray:
        say("bench --grid: Ray is not installed (pip install 'pe-bench[ray]'); its row is left out")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pe-bench-grid-") as scratch:
        warm = GridBenchSpec(spec.tasks, spec.methods.split(",")[0], "0", ("optim.epochs=1",), 1, False)
        say(f"bench --grid: caching the tiny data of {spec.tasks} (one short cell per task, not timed)")
        _timed_run(_command(warm, Path(scratch) / "warm-up", "--jobs", "1"))
        reference: dict[tuple[str, str, int], float] | None = None
        for label, extra, env in runs:
            out = Path(scratch) / label.replace(" ", "_").replace("-", "")
            say(f"bench --grid: {label} ...")
            seconds = _timed_run(_command(spec, out, *extra), env)
            scores = _scores(out)
            reference = reference or scores
            if set(scores) != set(reference):
                raise RuntimeError(f"bench --grid: {label} finished other cells than --jobs 1")
            drift = max(abs(scores[k] - reference[k]) for k in scores)
            rows.append({"run": label, "wall_s": seconds, "cells": len(scores), "max_score_diff": drift})
    table = pd.DataFrame(rows).set_index("run")
    table["speedup_vs_1_job"] = table["wall_s"].iloc[0] / table["wall_s"]
    return table
