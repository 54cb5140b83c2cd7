"""Grids beyond one process: --jobs on this machine, a real local Ray cluster (with a worker
killed mid-cell), and submitit's local executor with the sbatch parameters checked."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from tiny_grid import SMALL, cli_command, run_args

from pe_bench.harness.grid import store
from pe_bench.harness.grid.executor import GpuSlots, SlurmExecutor, SlurmSettings, cell_resources

pytestmark = pytest.mark.slow


def scores(out: Path) -> dict[tuple[str, int], float]:
    return {(r.method, r.seed): r.score for r in store.load_records(out) if r.status == "ok"}


def test_jobs_run_cells_in_parallel_processes_with_the_results_of_a_sequential_grid(tmp_path):
    sequential, parallel = tmp_path / "sequential", tmp_path / "parallel"
    threads = ["--set", "trainer.threads=1"]
    done = subprocess.run(cli_command(*run_args(sequential, "nopos,rope,sincos"), *threads), capture_output=True)
    assert done.returncode == 0, done.stderr
    command = cli_command(*run_args(parallel, "nopos,rope,sincos"), "--jobs", "2")
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "2 at once with 1 CPU thread(s) each" in done.stdout
    assert scores(parallel) == scores(sequential) and len(scores(parallel)) == 3
    pids = {json.loads((store.cell_dir(parallel, "imagenet", m, 0) / "result.json").read_text())["trained_by"]["pid"]
            for m in ("nopos", "rope", "sincos")}  # fmt: skip
    assert len(pids) == 3  # each cell in its own process
    assert (parallel / "logs" / "imagenet" / "rope" / "seed0.log").read_text().strip()
    again = subprocess.run(command, capture_output=True, text=True)  # the cells stored threads=1: reused
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "3 of 3 cells finished earlier" in again.stdout


def test_gpu_slots_pack_cells_by_share():
    slots = GpuSlots([0, 1], share=0.25)
    taken = [slots.take() for _ in range(9)]
    assert taken == [0, 0, 0, 0, 1, 1, 1, 1, None]
    slots.give(1)
    assert slots.take() == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_cluster():
    """A real Ray cluster on the loopback interface: a head with two CPUs (two worker slots)."""
    pytest.importorskip("ray")
    # Ray's unix sockets live under its temp dir, whose path must stay short (< 108 bytes).
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    port = free_port()
    # A throw-away cluster of the test only: no usage report, no token authentication.
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    env = dict(os.environ)
    ray_bin = str(Path(sys.executable).with_name("ray"))
    start = [ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
             "--include-dashboard=false", f"--temp-dir={temp}"]  # fmt: skip
    started = subprocess.run(start, capture_output=True, text=True, env=env, timeout=180)
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    yield f"127.0.0.1:{port}"
    subprocess.run([ray_bin, "stop", "--force"], capture_output=True, env=env, timeout=120)
    shutil.rmtree(temp, ignore_errors=True)


def kill_first_cell_owner(out: Path, killed: list[int], stop: threading.Event) -> None:
    """Wait until a cell is locked by a Ray worker, then kill that worker (SIGKILL) mid-cell."""
    while not stop.is_set():
        for lock in out.glob("runs/*/*/.seed*.lock"):
            try:
                owner = json.loads(lock.read_text())
            except (OSError, ValueError):
                continue
            os.kill(owner["pid"], signal.SIGKILL)  # the lock is taken right before training starts
            killed.append(owner["pid"])
            return
        time.sleep(0.2)


def test_ray_executor_on_a_local_cluster_retries_a_killed_worker(tmp_path, ray_cluster):
    out = tmp_path / "out"
    killed: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=kill_first_cell_owner, args=(out, killed, stop), daemon=True)
    watcher.start()
    longer = ["--set", "optim.epochs=3", "--set", "data.train_size=256"]  # cells outlive the watcher's poll
    command = cli_command(*run_args(out, "nopos,rope"), *longer, "--executor", "ray", "--address", ray_cluster)
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    stop.set()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert killed, "the test never saw a locked cell to kill"
    records = {r.method: r for r in store.load_records(out)}
    assert {m: r.status for m, r in records.items()} == {"nopos": "ok", "rope": "ok"}
    trainers = {json.loads((store.cell_dir(out, "imagenet", m, 0) / "result.json").read_text())["trained_by"]["pid"]
                for m in records}  # fmt: skip
    assert not trainers & set(killed)  # the killed cell was redone by another worker process


def test_submitit_local_executor_runs_the_grid_as_jobs(tmp_path):
    pytest.importorskip("submitit")
    from pe_bench.harness.grid.methods import parse_methods
    from pe_bench.harness.grid.runner import GridRequest, run_grid

    overrides = {"optim": {"epochs": 1}, "data": {"train_size": 64, "val_size": 32, "test_size": 32},
                 "model": {"dim": 32, "depth": 1}, "trainer": {"threads": 1}}  # fmt: skip
    request = GridRequest(["imagenet"], parse_methods("nopos,rope"), out=tmp_path, overrides=overrides)
    request.executor = SlurmExecutor(SlurmSettings(timeout_min=10), cluster="local")
    records = run_grid(request, say=lambda _: None)
    assert [r.status for r in records] == ["ok", "ok"]
    assert list((tmp_path / "slurm").iterdir())  # submitit's job folders


def test_sbatch_parameters_come_from_the_cell_profile(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    # No SLURM here: let submitit's SLURM executor build its sbatch file without finding srun.
    monkeypatch.setattr(submitit.slurm.slurm.SlurmExecutor, "affinity", classmethod(lambda cls: 1))
    from pe_bench.harness.config import load_run_config

    config = load_run_config("imagenet", "paper", {"trainer": {"threads": 8, "accelerator": "gpu", "devices": 4}})
    slurm = SlurmExecutor(SlurmSettings(partition="gpu", timeout_min=600, mem_gb=64))
    params = slurm.parameters(cell_resources(config))
    assert params == {"timeout_min": 600, "cpus_per_task": 8, "nodes": 1, "tasks_per_node": 1,
                      "slurm_array_parallelism": 64, "name": "pe-bench", "gpus_per_node": 4,
                      "slurm_partition": "gpu", "mem_gb": 64}  # fmt: skip
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(**params)
    text = executor._executor._make_submission_file_text("python -m pe_bench.harness.grid.cell", "uid")
    for line in ("#SBATCH --cpus-per-task=8", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu",
                 "#SBATCH --time=600", "#SBATCH --mem=64GB", "#SBATCH --signal=USR2@90"):  # fmt: skip
        assert line in text, text
    # Preemption: submitit sends USR2 (the --signal line above), calls the callable's
    # checkpoint() and requeues what it returns: the same cell, which restarts from scratch.
    from pe_bench.harness.grid.executor import _SlurmCell

    cell = _SlurmCell({"out": str(tmp_path)}, ("imagenet", "rope", 0), 8)
    again = cell.checkpoint()
    assert isinstance(again, submitit.helpers.DelayedSubmission) and again.function.cell == cell.cell


def test_missing_ray_names_the_extra(monkeypatch, capsys):
    import builtins

    from pe_bench.harness.cli import main

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    code = main(["run", "--tasks", "imagenet", "--methods", "nopos", "--executor", "ray", *SMALL])
    assert code == 2 and "pip install 'pe-bench[ray]'" in capsys.readouterr().err
