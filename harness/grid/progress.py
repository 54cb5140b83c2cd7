"""What a cell tells the user while it trains, and what it keeps of each epoch.

``EpochLog`` is a Lightning callback that collects one row per epoch (training loss, the
validation metrics, learning rate, seconds) and rewrites the cell's ``metrics.csv`` after
every epoch: one row per epoch, unlike Lightning's CSVLogger, which puts training and
validation metrics of the same epoch on separate rows. Without progress bars (stdout not a
terminal: a batch job, ``nohup``, CI) it also prints one line per epoch, so a long cell is
never silent for minutes. ``grid_progress`` is the done/left/ETA line of a grid.

Epochs are counted from 1 here and in the record's ``best_epoch``, as a reader counts them.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

METRICS_FILE = "metrics.csv"


def print_flushed(line: str) -> None:
    print(line, flush=True)  # flushed: a redirected stdout is block-buffered


class EpochLog(Callback):
    """One row per epoch in ``<workdir>/metrics.csv``, and a printed line per epoch if ``say``.

    ``monitor`` (e.g. ``val/acc``) comes first among the validation columns; ``scale`` and
    ``label`` print it in table units (``acc 91.3`` for an accuracy of 0.913).
    """

    def __init__(
        self, workdir: Path, monitor: str, label: str, scale: float = 1.0, say: Callable[[str], None] | None = None
    ) -> None:
        self.path = Path(workdir) / METRICS_FILE
        self.monitor, self.label, self.scale, self.say = monitor, label, scale, say
        self.rows: list[dict[str, Any]] = []
        self._epoch_start = 0.0
        self._validated = False

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_start = time.perf_counter()
        self._validated = False

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Validation of this epoch has run by now (Lightning validates inside the epoch loop),
        # and the epoch-level training metrics are aggregated.
        metrics = {k: _number(v) for k, v in trainer.callback_metrics.items()}
        row: dict[str, Any] = {"epoch": trainer.current_epoch + 1}
        row.update({k: v for k, v in metrics.items() if k.startswith("train/")})
        if self._validated:
            val = {k: v for k, v in metrics.items() if k.startswith("val/")}
            row.update({self.monitor: val.pop(self.monitor, None)} | dict(sorted(val.items())))
        row["lr"] = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        row["seconds"] = round(time.perf_counter() - self._epoch_start, 3)
        self.rows.append(row)
        if not trainer.is_global_zero:  # under DDP one process writes and prints
            return
        self.write()
        if self.say is not None:
            self.say(self.epoch_line(row, trainer.max_epochs))

    def write(self) -> None:
        columns = list(dict.fromkeys(key for row in self.rows for key in row))
        columns.append(columns.pop(columns.index("lr")))
        columns.append(columns.pop(columns.index("seconds")))
        with self.path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)

    def epoch_line(self, row: dict[str, Any], max_epochs: int | None) -> str:
        parts = []
        if row.get("train/loss") is not None:
            parts.append(f"loss {row['train/loss']:.4f}")
        value = row.get(self.monitor)
        if value is not None:
            parts.append(f"val {self.label} {value * self.scale:.2f}")
        of = f"/{max_epochs}" if max_epochs and max_epochs > 0 else ""
        return f"    epoch {row['epoch']}{of}: {', '.join(parts) or 'no metrics'} ({row['seconds']:.1f}s)"


def _number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().cpu()) if value.numel() == 1 else None
    return float(value) if isinstance(value, int | float) else None


def best_epoch(checkpoint_path: str | Path) -> int | None:
    """The epoch (counted from 1) at which a ModelCheckpoint saved ``checkpoint_path``."""
    if not checkpoint_path:
        return None
    # mmap: only the small header is read, not the weights (hundreds of MB for a ViT-B).
    saved = torch.load(checkpoint_path, map_location="cpu", weights_only=True, mmap=True)
    epoch = saved.get("epoch")
    return None if epoch is None else int(epoch) + 1


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: short enough for a progress line."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def grid_progress(done: int, total: int, elapsed: float) -> str:
    """The grid's progress line after ``done`` of ``total`` cells in ``elapsed`` seconds.

    Count only the cells this invocation trains (not those finished earlier and skipped,
    which take no time and would make the estimate far too short). The ETA assumes the
    remaining cells take as long on average as the ones done so far.
    """
    if total < 0 or not 0 <= done <= total:
        raise ValueError(f"grid_progress: need 0 <= done <= total, got done={done}, total={total}")
    left = total - done
    line = f"{done}/{total} cells done, {left} left, {format_duration(elapsed)} elapsed"
    if done and left:
        line += f", ETA {format_duration(elapsed / done * left)}"
    return line
