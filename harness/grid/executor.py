"""Executors: how the cells of a grid are run — one after the other, N at once on this
machine, as Ray tasks on a cluster, or as a SLURM job array through submitit.

Every executor runs the same unit: one cell, by :func:`run_cell_entry` (in-process) or
``python -m pe_bench.harness.grid.cell`` (a subprocess). Results reach the grid only
through the result store (each cell writes its own record atomically, under its cell lock),
so the executor never carries results back and ``pe-bench table`` works the same whatever
ran the cells. A cell is idempotent: a cell that finished is skipped, one locked by a live
process elsewhere is left to it, and one whose process died is retried from scratch (its
stale lock is broken). That is what makes retries by Ray and requeues by SLURM safe.

Requirements on ``--out`` for Ray and SLURM: every worker must see the same directory at
the same path (a shared filesystem such as NFS or Lustre) with atomic ``rename`` and
``O_EXCL`` file creation (true of NFSv3+ and Lustre), because that is how cells are locked
and published.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: (task, method label, seed)
Cell = tuple[str, str, int]


class ExecutorUnavailable(RuntimeError):
    """An optional executor whose package is missing; the message names the extra."""


def request_payload(request: Any) -> dict[str, Any]:
    """The grid request as JSON-able data, for a cell run elsewhere (subprocess, Ray, SLURM)."""
    return {
        "tasks": list(request.tasks),
        "methods": [m.label for m in request.methods],
        "profile": request.profile,
        "seeds": list(request.seeds),
        "out": str(request.out),
        "data_root": None if request.data_root is None else str(request.data_root),
        "overrides": request.overrides,
        "task_overrides": request.task_overrides,
        "profile_sections": request.profile_sections,
    }


#: The environment variable through which a cell process learns its grid process's PID.
GRID_PID_VARIABLE = "PE_BENCH_GRID_PID"


def run_cell_entry(payload: dict[str, Any], cell: Cell, threads: int | None = None) -> str:
    """Run one cell in this process from a request payload; returns the record's status."""
    from .methods import parse_method
    from .runner import GridRequest, claim_and_run, quiet_lightning

    quiet_lightning()
    overrides = dict(payload["overrides"])
    if threads:
        overrides.setdefault("trainer", {})
        overrides["trainer"] = {**overrides["trainer"], "threads": threads}
    request = GridRequest(
        tasks=payload["tasks"],
        methods=[parse_method(m) for m in payload["methods"]],
        profile=payload["profile"],
        seeds=payload["seeds"],
        out=Path(payload["out"]),
        data_root=None if payload["data_root"] is None else Path(payload["data_root"]),
        overrides=overrides,
        task_overrides=payload.get("task_overrides") or {},
        profile_sections=payload.get("profile_sections") or {},
    )
    task, method, seed = cell
    outcome = claim_and_run(request, (task, parse_method(method), seed), _name(cell), print, retry_failed=True)
    return getattr(outcome, "status", "elsewhere")  # a live process elsewhere holds the cell


def cell_argv(payload_file: Path, cell: Cell, threads: int | None) -> list[str]:
    """The arguments of ``python -m pe_bench.harness.grid.cell`` for one cell."""
    task, method, seed = cell
    return [str(payload_file), task, method, str(seed), *(["--threads", str(threads)] if threads else [])]


def log_path(out: Path, cell: Cell) -> Path:
    from .store import method_dirname

    task, method, seed = cell
    return Path(out) / "logs" / task / method_dirname(method) / f"seed{seed}.log"


class Executor(ABC):
    """Runs cells; their records land in the store."""

    name: str = ""

    @abstractmethod
    def run(self, request: Any, cells: list[Cell], say: Callable[[str], None]) -> None: ...

    def describe(self, pending: int) -> str:
        return f"{pending} to run by the {self.name} executor"

    def cell_threads(self, config: Any) -> int | None:
        """The CPU threads a cell of ``config`` runs with under this executor (stored in its
        config.yaml, so a re-run must ask for the same): its ``trainer.threads``, at least 1."""
        return config.trainer.threads or 1


def auto_jobs() -> int:
    """``--jobs auto``: one cell per CPU core this process may use."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@dataclass
class GpuSlots:
    """Cells packed onto GPUs: each GPU holds ``floor(1 / share)`` cells at once."""

    gpus: list[int]
    share: float = 1.0
    used: dict[int, int] = field(default_factory=dict)

    @property
    def per_gpu(self) -> int:
        return max(1, int(1.0 / self.share + 1e-9))

    def take(self) -> int | None:
        for gpu in self.gpus:
            if self.used.get(gpu, 0) < self.per_gpu:
                self.used[gpu] = self.used.get(gpu, 0) + 1
                return gpu
        return None

    def give(self, gpu: int | None) -> None:
        if gpu is not None:
            self.used[gpu] -= 1


#: Imported once by the fork server that ``--jobs`` forks its cell processes from.
PRELOAD = ["torch", "lightning", "torchmetrics", "pe_bench.harness.grid.runner"]


def _cell_in_child(argv: list[str], log: str, env: dict[str, str]) -> None:
    """A cell process forked from the fork server: output to the cell's log, the cell's
    environment, then what ``python -m pe_bench.harness.grid.cell ARGV`` would do."""
    from .cell import main

    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.environ.update(env)  # before anything initialises CUDA or OpenMP in this process
    sys.exit(main(argv))


class CellProcess:
    """One cell in its own process, with ``subprocess.Popen``'s poll/returncode/terminate/wait.

    Cells are forked from a fork server that has imported torch and Lightning once, instead
    of each starting a fresh interpreter: importing them costs a cell process about 5 CPU
    seconds (measured here), which over the card's main job of 30 tiny cells is more than a
    minute of its wall time on 2 cores. The fork server never touches CUDA or threads, so its
    children start clean (the reason to prefer it to forking the grid process itself); where
    there is no fork server (Windows), a fresh interpreter runs ``python -m
    pe_bench.harness.grid.cell``."""

    _context: Any = None

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        import multiprocessing

        self.popen: subprocess.Popen | None = None
        if "forkserver" not in multiprocessing.get_all_start_methods():
            handle = log.open("w")
            command = [sys.executable, "-m", "pe_bench.harness.grid.cell", *argv]
            self.popen = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **env})
            handle.close()
            return
        if CellProcess._context is None:
            CellProcess._context = multiprocessing.get_context("forkserver")
            CellProcess._context.set_forkserver_preload(PRELOAD)
        self.process = CellProcess._context.Process(target=_cell_in_child, args=(argv, str(log), env), daemon=False)
        self.process.start()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode if self.popen else self.process.exitcode

    def poll(self) -> int | None:
        return self.popen.poll() if self.popen else self.process.exitcode

    def terminate(self) -> None:
        (self.popen or self.process).terminate()

    def wait(self, timeout: float | None = None) -> None:
        if self.popen:
            self.popen.wait(timeout=timeout)
        else:
            self.process.join(timeout)


@dataclass
class _Running:
    cell: Cell
    process: CellProcess
    started: float
    gpu: int | None


class ParallelExecutor(Executor):
    """N cells at once on this machine, each in its own process.

    CPU threads are divided between the running cells (``trainer.threads`` of each cell is
    ``cores // jobs``, at least 1). With GPUs, cells are packed by ``gpu_share`` (0.25: four
    tiny cells per GPU; 1: one cell per GPU) through ``CUDA_VISIBLE_DEVICES``. Each cell
    writes its output to ``<out>/logs/<task>/<method>/seed<N>.log``; the console gets one
    line when a cell starts or ends and the grid's done / running / failed / estimated time
    left.
    """

    name = "jobs"

    def __init__(self, jobs: int, gpus: list[int] | None = None, gpu_share: float = 1.0, poll: float = 0.5) -> None:
        self.jobs = max(1, jobs)
        self.slots = GpuSlots(gpus, gpu_share) if gpus else None
        if self.slots:  # never more cells than the GPUs hold
            self.jobs = min(self.jobs, len(self.slots.gpus) * self.slots.per_gpu)
        self.threads = max(1, auto_jobs() // self.jobs)
        self.poll = poll

    def cell_threads(self, config: Any) -> int | None:
        return self.threads

    def describe(self, pending: int) -> str:
        gpus = f", {self.slots.per_gpu} per GPU on GPUs {self.slots.gpus}" if self.slots else ""
        return f"{pending} to run, {self.jobs} at once with {self.threads} CPU thread(s) each{gpus}"

    def run(self, request: Any, cells: list[Cell], say: Callable[[str], None]) -> None:
        out = Path(request.out)
        payload_file = out / "logs" / f".grid-{os.getpid()}.json"
        payload_file.parent.mkdir(parents=True, exist_ok=True)
        payload_file.write_text(json.dumps(request_payload(request)))
        waiting, running = list(cells), []
        done = failed = 0
        durations: list[float] = []
        start = time.perf_counter()
        try:
            while waiting or running:
                while waiting and len(running) < self.jobs:
                    gpu = self.slots.take() if self.slots else None
                    if self.slots and gpu is None:
                        break
                    cell = waiting.pop(0)
                    running.append(self._start(cell, payload_file, out, gpu))
                    say(f"start  {_name(cell)} (log: {log_path(out, cell)})")
                time.sleep(self.poll)
                for job in [j for j in running if j.process.poll() is not None]:
                    running.remove(job)
                    if self.slots:
                        self.slots.give(job.gpu)
                    elapsed = time.perf_counter() - job.started
                    durations.append(elapsed)
                    ok = job.process.returncode == 0
                    done += 1
                    failed += not ok
                    left = len(waiting) + len(running)
                    eta = _eta(durations, left, self.jobs)
                    state = "done  " if ok else "FAILED"
                    say(
                        f"{state} {_name(job.cell)} in {elapsed:.0f}s · grid: {done} done, {len(running)} running, "
                        f"{failed} failed, {left} left{eta} · {time.perf_counter() - start:.0f}s"
                    )
        finally:
            for job in running:  # interrupted: stop the cells we started (their locks are released)
                job.process.terminate()
            for job in running:
                job.process.wait(timeout=30)
            payload_file.unlink(missing_ok=True)

    def _start(self, cell: Cell, payload_file: Path, out: Path, gpu: int | None) -> _Running:
        log = log_path(out, cell)
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {"OMP_NUM_THREADS": str(self.threads), "PYTHONUNBUFFERED": "1", GRID_PID_VARIABLE: str(os.getpid())}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        process = CellProcess(cell_argv(payload_file, cell, self.threads), log, env)
        return _Running(cell, process, time.perf_counter(), gpu)


def _name(cell: Cell) -> str:
    return f"{cell[0]} · {cell[1]} · seed {cell[2]}"


def _eta(durations: list[float], left: int, jobs: int) -> str:
    if not durations or not left:
        return ""
    mean = sum(durations) / len(durations)
    return f", about {mean * left / jobs / 60:.1f} min left"


def cell_resources(config: Any) -> dict[str, Any]:
    """A cell's resource request from its config: CPUs (``trainer.threads``, default 1),
    GPUs (``trainer.devices`` when the accelerator is a GPU) and nodes."""
    trainer = config.trainer
    cpus = trainer.threads or 1
    on_gpu = trainer.accelerator in ("gpu", "cuda")
    gpus = (trainer.devices if isinstance(trainer.devices, int) else 1) if on_gpu else 0
    return {"cpus": cpus, "gpus": gpus, "nodes": trainer.num_nodes}


class RayExecutor(Executor):
    """Each cell is a Ray task with its resource request; a task whose worker dies is retried
    (``max_retries``), and the retry breaks the dead process's stale cell lock."""

    name = "ray"

    def __init__(self, address: str | None = None, max_retries: int = 3, gpu_share: float = 1.0) -> None:
        try:
            import ray
        except ImportError:
            raise ExecutorUnavailable(
                "--executor ray needs Ray: pip install 'pe-bench[ray]' (or pip install ray)"
            ) from None
        self.ray = ray
        self.address = address
        self.max_retries = max_retries
        self.gpu_share = gpu_share

    def run(self, request: Any, cells: list[Cell], say: Callable[[str], None]) -> None:
        ray = self.ray
        if not ray.is_initialized():
            ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False)
        payload = request_payload(request)
        remote = ray.remote(_ray_cell)
        pending = {}
        for cell in cells:
            resources = cell_resources(request.run_config(cell[0]))
            task = remote.options(
                num_cpus=resources["cpus"],
                num_gpus=resources["gpus"] * self.gpu_share if resources["gpus"] else 0,
                max_retries=self.max_retries,
                retry_exceptions=False,
            ).remote(payload, cell, resources["cpus"])
            pending[task] = cell
        done = 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            cell = pending.pop(ready[0])
            done += 1
            try:
                status = ray.get(ready[0])
            except Exception as err:  # the cell's retries are exhausted; the store says why if it got that far
                status = f"error ({type(err).__name__})"
            say(f"{status:8s} {_name(cell)} · grid: {done} done, {len(pending)} left")


def _ray_cell(payload: dict[str, Any], cell: Cell, threads: int) -> str:
    return run_cell_entry(payload, cell, threads)


@dataclass
class SlurmSettings:
    """sbatch parameters of the job array (from the task profile's trainer, overridable)."""

    partition: str | None = None
    timeout_min: int = 24 * 60
    mem_gb: int | None = None
    array_parallelism: int = 64
    extra: dict[str, Any] = field(default_factory=dict)


class _SlurmCell:
    """A submitit callable that requeues itself on preemption (the cell restarts from scratch;
    finished cells are skipped and a preempted cell's lock is stale once its job is gone)."""

    def __init__(self, payload: dict[str, Any], cell: Cell, threads: int) -> None:
        self.payload, self.cell, self.threads = payload, cell, threads

    def __call__(self) -> str:
        return run_cell_entry(self.payload, self.cell, self.threads)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(_SlurmCell(self.payload, self.cell, self.threads))


class SlurmExecutor(Executor):
    """One SLURM job array per grid through submitit (``cluster="local"`` runs the same jobs as
    local processes, which is how it is tested without SLURM)."""

    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None, cluster: str | None = None) -> None:
        try:
            import submitit
        except ImportError:
            raise ExecutorUnavailable(
                "--executor slurm needs submitit: pip install 'pe-bench[slurm]' (or pip install submitit)"
            ) from None
        self.submitit = submitit
        self.settings = settings or SlurmSettings()
        self.cluster = cluster

    def parameters(self, resources: dict[str, Any]) -> dict[str, Any]:
        """submitit's update_parameters for one array (every cell of a grid asks the same)."""
        s = self.settings
        params: dict[str, Any] = {
            "timeout_min": s.timeout_min,
            "cpus_per_task": resources["cpus"],
            "nodes": resources["nodes"],
            "tasks_per_node": max(1, resources["gpus"]) if resources["nodes"] > 1 else 1,
            "slurm_array_parallelism": s.array_parallelism,
            "name": "pe-bench",
        }
        if resources["gpus"]:
            params["gpus_per_node"] = resources["gpus"]
        if s.partition:
            params["slurm_partition"] = s.partition
        if s.mem_gb:
            params["mem_gb"] = s.mem_gb
        return params | s.extra

    def run(self, request: Any, cells: list[Cell], say: Callable[[str], None]) -> None:
        payload = request_payload(request)
        by_resources: dict[str, list[Cell]] = {}
        resources_of: dict[str, dict[str, Any]] = {}
        for cell in cells:
            resources = cell_resources(request.run_config(cell[0]))
            key = json.dumps(resources, sort_keys=True)
            by_resources.setdefault(key, []).append(cell)
            resources_of[key] = resources
        jobs = []
        for key, group in by_resources.items():
            executor = self.submitit.AutoExecutor(folder=Path(request.out) / "slurm" / "%j", cluster=self.cluster)
            executor.update_parameters(**self.parameters(resources_of[key]))
            with executor.batch():
                for cell in group:
                    jobs.append((cell, executor.submit(_SlurmCell(payload, cell, resources_of[key]["cpus"]))))
            say(f"submitted a job array of {len(group)} cells ({key})")
        for done, (cell, job) in enumerate(jobs, 1):
            try:
                status = job.result()
            except Exception as err:
                status = f"error ({type(err).__name__})"
            say(f"{status:8s} {_name(cell)} · grid: {done}/{len(jobs)}")
