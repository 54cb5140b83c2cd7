"""A DDP cell: one cell trained by several processes, driven by the one grid process.

Lightning's default DDP launcher starts ranks 1..N-1 by re-running the command line of the
process that calls ``fit``. Called from the grid, that re-ran the whole ``pe-bench run`` in
every rank: every rank walked the grid, printed the table, and fought over cell locks. So the
grid process never fits a multi-process cell itself. It holds the cell's lock and staging
folder and starts ``python -m pe_bench.harness.grid.ddp REQUEST.json``, a fresh process whose
command line is exactly "fit this one cell into this folder"; that process is rank 0 and
Lightning's launcher re-runs it as the other ranks, which is now what it should do. A fresh
subprocess rather than ``ddp_spawn`` from the grid process: spawn pickles the model and data
module into each rank (not every task's is picklable) and, run from the grid process, would
still need the test step below. Rank 0 writes ``best.ckpt`` and ``metrics.csv`` into the
staging folder, and a summary of the fit (``fit.json``) that the grid process reads.

Evaluation counts every sample once. Validation during the fit reads the whole split in
every rank (``harness.data.WholeSplit``) with the metrics' cross-rank sync off, so each rank
computes the single-process value and the ranks agree on the best checkpoint. The test is
run afterwards by the grid process itself on one device, from ``best.ckpt``: a plain
single-process test of the full test set. The grid process then writes the record and
promotes the cell as for any other cell.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn

from ..config import ConfigError, TrainerConfig
from ..module import DivergedError
from .progress import best_epoch

REQUEST = "ddp-request.json"  # what the ranks fit; removed once they are done
SUMMARY = "fit.json"  # what rank 0 reports back; removed once read


def probe_trainer(trainer: TrainerConfig) -> Trainer:
    """A Trainer built from ``trainer``'s device settings and never run: how Lightning resolves
    the accelerator, ``devices`` (``auto`` is every GPU), the strategy and the cluster
    environment on this machine."""
    return Trainer(
        accelerator=trainer.accelerator,
        devices=trainer.devices,
        strategy=trainer.strategy,
        num_nodes=trainer.num_nodes,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def launches_ranks(trainer: TrainerConfig) -> bool:
    """Whether a cell with these trainer settings runs in several processes that pe-bench starts.

    Lightning resolves ``devices`` (``auto`` is every GPU), the strategy and the cluster
    environment; a probe Trainer (``probe_trainer``) asks it. Ranks started by a cluster
    launcher (torchrun, SLURM tasks) are already separate processes: they are left to it.
    """
    probe = probe_trainer(trainer)
    if probe.world_size <= 1:
        return False
    environment = getattr(probe.strategy, "cluster_environment", None)
    if environment is not None and environment.creates_processes_externally:
        return False
    if trainer.num_nodes > 1:
        raise ConfigError(
            f"trainer.num_nodes={trainer.num_nodes}: pe-bench starts the ranks of one node only; "
            "start a multi-node cell under a cluster launcher (SLURM, torchrun), or use num_nodes=1"
        )
    return True


def fit_in_ranks(workdir: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Fit a cell in its own ranks (a fresh process tree) into ``workdir``; rank 0's summary.

    ``request`` holds what the ranks rebuild the cell from (:func:`main`). A failure in the
    ranks is raised here, a divergence as :class:`DivergedError`; Ctrl-C or any other
    interruption here stops the whole process tree."""
    request_file, summary_file = workdir / REQUEST, workdir / SUMMARY
    request_file.write_text(json.dumps(request))
    summary_file.unlink(missing_ok=True)
    # A session of its own: the ranks are stopped together, by this process, and a terminal's
    # Ctrl-C reaches this process only (which then stops them).
    process = subprocess.Popen([sys.executable, "-m", __name__, str(request_file)], start_new_session=True)
    try:
        status = process.wait()
    except BaseException:
        _stop(process)
        raise
    finally:
        request_file.unlink(missing_ok=True)
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    summary_file.unlink(missing_ok=True)
    if "error" in summary:
        error = summary["error"]
        kind = DivergedError if error["type"] == DivergedError.__name__ else RuntimeError
        raise kind(f"{error['message']} (in DDP rank 0; {error['traceback'].strip().splitlines()[-1]})")
    if status != 0 or "best_path" not in summary:
        raise RuntimeError(f"the DDP ranks of this cell exited with status {status} without a result (output above)")
    return summary


def _stop(process: subprocess.Popen) -> None:
    """Stop rank 0 and every rank it started (they share its process group)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def local_metrics(module: nn.Module) -> None:
    """Compute every torchmetrics metric of ``module`` from this rank's own states (no gather):
    under DDP each rank evaluates the whole split (harness.data.WholeSplit), so gathering
    would count every sample once per rank."""
    from torchmetrics import Metric

    for metric in module.modules():
        if isinstance(metric, Metric):
            metric.distributed_available_fn = _never


def _never() -> bool:
    return False


class FitSummary(Callback):
    """Rank 0 writes what the grid process needs of the fit: the best checkpoint, its
    validation value and epoch, the fit's seconds and the data module's extra results.

    At ``on_fit_end`` in the process that is global rank 0, whichever launcher started it
    (with ``ddp_spawn`` the launching process does not get the checkpoint's score back)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = time.perf_counter()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.start = time.perf_counter()  # in the rank, once the process and its imports are up

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        checkpoint = trainer.checkpoint_callback
        best_path = getattr(checkpoint, "best_model_path", "")
        best_val = getattr(checkpoint, "best_model_score", None)
        extra = getattr(trainer.datamodule, "extra_results", None)
        summary = {
            "best_path": best_path,
            "best_val": None if best_val is None else float(best_val),
            "best_epoch": best_epoch(best_path),
            "train_seconds": time.perf_counter() - self.start,
            "data_extra": dict(extra()) if callable(extra) else {},
        }
        self.path.write_text(json.dumps(summary))


def _write_error(path: Path, err: BaseException) -> None:
    error = {"type": type(err).__name__, "message": str(err), "traceback": traceback.format_exc(limit=8)}
    path.write_text(json.dumps({"error": error}))


def main(argv: list[str] | None = None) -> int:
    """One rank of a DDP cell (rank 0 as started by :func:`fit_in_ranks`, the others as
    Lightning's launcher re-runs it): rebuild the cell from the request and fit it."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("request", type=Path)
    request = json.loads(parser.parse_args(argv).request.read_text())
    from pe_bench.tasks import get_task

    from ..config import load_run_config
    from .methods import parse_method
    from .runner import fit_ranks, quiet_lightning, torch_threads

    quiet_lightning()
    workdir = Path(request["workdir"])
    rank_zero = os.environ.get("LOCAL_RANK", "0") == "0"
    try:
        section = request.get("profile_section")  # the task YAML as the grid read it at its start
        config = load_run_config(request["task"], request["profile"], request["overrides"], section)
        data_root = None if request["data_root"] is None else Path(request["data_root"])
        task = get_task(request["task"])(config, data_root)
        method = parse_method(request["method"])
        make_encoding = method.encoding(config.methods.get(method.name))
        grid = None if request["grid"] is None else Path(request["grid"])
        with torch_threads(config.trainer.threads):
            fit_ranks(
                task, make_encoding, request["seed"], workdir, request["progress"], request["run_name"], grid,
                FitSummary(workdir / SUMMARY),
            )  # fmt: skip
    except Exception as err:
        if rank_zero:
            _write_error(workdir / SUMMARY, err)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
