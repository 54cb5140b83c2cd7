"""The results store: one directory per finished cell, written atomically.

    <out>/runs/<task>/<method>/seed<N>/
        config.yaml    resolved run config (task, profile, model, optim, trainer, data, method options)
        env.json       package versions, git sha, device, threads
        metrics.csv    per-epoch training/validation log (Lightning's CSVLogger)
        best.ckpt      weights of the best-validation checkpoint
        result.json    the record; written last, so its presence means "finished"

A cell is trained in a hidden sibling directory and renamed into place when done, so an
interrupted run never leaves a half-written cell behind.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

RECORD = "result.json"
STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_DIVERGED = "diverged"
STATUS_NA = "n/a"


@dataclass
class CellRecord:
    task: str
    method: str
    seed: int
    profile: str
    status: str
    metric: str = ""
    metric_label: str = ""
    higher_is_better: bool = True
    score: float | None = None  # test metric of the best-validation checkpoint, in table units
    best_val: float | None = None
    best_epoch: int | None = None
    train_seconds: float | None = None
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def cell_dir(out: Path, task: str, method: str, seed: int) -> Path:
    return Path(out) / "runs" / task / method_dirname(method) / f"seed{seed}"


def method_dirname(method: str) -> str:
    """Method specs like ``pape[m=8]`` become safe directory names (``pape[m=8]`` stays readable)."""
    return "".join(c if c.isalnum() or c in "-_.=[],+" else "_" for c in method)


def write_json_atomic(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def read_record(directory: Path) -> CellRecord | None:
    path = directory / RECORD
    if not path.is_file():
        return None
    return CellRecord(**json.loads(path.read_text()))


def write_record(directory: Path, record: CellRecord) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / RECORD, asdict(record))


def staging_dir(final: Path) -> Path:
    """A fresh hidden sibling of ``final`` to train in."""
    # Leftovers of an interrupted earlier attempt at this cell are worthless: remove them.
    for stale in final.parent.glob(f".{final.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = final.with_name(f".{final.name}.partial-{os.getpid()}")
    staging.mkdir(parents=True)
    return staging


def promote(staging: Path, final: Path) -> None:
    """Replace ``final`` with the finished ``staging`` directory."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


def load_records(out: Path) -> list[CellRecord]:
    runs = Path(out) / "runs"
    if not runs.is_dir():
        return []
    return [CellRecord(**json.loads(p.read_text())) for p in sorted(runs.glob(f"*/*/seed*/{RECORD}"))]


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def git_sha() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def device_description() -> str:
    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return f"cpu:{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def environment() -> dict[str, Any]:
    packages = ("pe-bench", "torch", "torchvision", "lightning", "torchmetrics", "pandas", "numpy", "pydantic")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {p: _version(p) for p in packages},
        "git_sha": git_sha(),
        "device": device_description(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
    }
