"""``pe-bench reproduce``: train the first epochs of stored cells again and compare them with
what the cells recorded, bit for bit.

A cell's numbers depend on more than its configuration: the code, the packages its data are
built from, the machine's arithmetic (thread count, CPU kernels, GPU). Training a whole cell
again to learn whether this machine reproduces a results folder costs the cell's full time;
its first epoch already says it, because every epoch's training loss, validation metric and
learning rate are in its ``metrics.csv`` and the schedule does not depend on where training
stops. So the cell is rebuilt from its ``config.yaml`` (its own options and effective trainer
settings), trained with its seed and its recorded thread count for the asked epochs with the
full schedule, and each row is compared with the stored one (every column but the wall time).
Where they differ, the report lists what else differs from the stored environment (env.json's
packages, Python, device, code version, and ``effective.data``): the usual causes.
"""

from __future__ import annotations

import csv
import json
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from pe_bench.harness.grid import ddp, store
from pe_bench.harness.grid.loggers import close_loggers
from pe_bench.harness.grid.progress import METRICS_FILE
from pe_bench.harness.grid.runner import (
    EFFECTIVE,
    cell_setup,
    effective_trainer,
    fit_trainer,
    lightning_interrupts_kept,
    model_parts,
    quiet_lightning,
    torch_threads,
)
from pe_bench.tasks import get_task

#: metrics.csv columns that are not a result of training (wall time)
NOT_COMPARED = ("seconds",)


class StopAfterEpochs(Callback):
    """Ends the fit after ``epochs`` epochs without changing the schedule the optimiser and
    learning-rate scheduler were built for (``optim.epochs``)."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


@dataclass
class Reproduction:
    cell: Path
    label: str  # task · method · seed N
    compared: int = 0  # epochs compared
    differences: list[str] = field(default_factory=list)  # the first differing epoch, per column
    environment: list[str] = field(default_factory=list)  # what differs from the stored environment
    skipped: str = ""  # why the cell was not trained again
    rows: list[dict[str, str]] = field(default_factory=list)  # the metrics.csv rows trained now

    @property
    def identical(self) -> bool:
        return not self.skipped and self.compared > 0 and not self.differences


def stored_cells(paths: Iterable[Path]) -> list[Path]:
    """The cells among ``paths``: a cell folder (with result.json) stands for itself, a
    results folder (with runs/) for every cell under it that is not n/a (nothing was trained)."""
    cells: list[Path] = []
    for path in map(Path, paths):
        if (path / store.RECORD).is_file():
            cells.append(path)
        elif (path / "runs").is_dir():
            found = sorted(p.parent for p in (path / "runs").glob(f"*/*/seed*/{store.RECORD}"))
            cells += [cell for cell in found if not _not_applicable(cell)]
        else:
            raise FileNotFoundError(
                f"{path} is neither a cell folder (RESULTS/runs/TASK/METHOD/seedN with {store.RECORD}) "
                "nor a results folder (with runs/)"
            )
    return cells


def _not_applicable(cell: Path) -> bool:
    record = store.read_record(cell)
    return record is not None and record.status == store.STATUS_NA


def read_metrics(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def compare_rows(stored: list[dict[str, str]], now: list[dict[str, str]], epochs: int) -> tuple[int, list[str]]:
    """(epochs compared, one line per column at its first differing epoch). Values compare as
    the numbers written (every column but the wall time); a column one side lacks differs."""
    compared = min(epochs, len(stored), len(now))
    differences: dict[str, str] = {}
    for old, new in zip(stored[:compared], now[:compared], strict=True):
        for column in dict.fromkeys([*old, *new]):
            if column in NOT_COMPARED or column in differences:
                continue
            a, b = old.get(column), new.get(column)
            if _value(a) != _value(b):
                differences[column] = f"{column} differs from epoch {old.get('epoch', '?')}: stored {a}, now {b}"
    if len(now) < min(epochs, len(stored)):  # the fit ended early
        differences["epochs"] = f"trained {len(now)} of {min(epochs, len(stored))} epochs"
    return compared, list(differences.values())


def _value(text: str | None) -> float | str | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return text


def environment_differences(stored_env: dict[str, Any], now_env: dict[str, Any]) -> list[str]:
    """Entries of env.json that differ between the stored cell and this process."""
    lines = []
    for key in ("python", "device", "torch_threads", "cpu_kernels", "cpu_model", "cuda"):
        if key in ("cpu_kernels", "cpu_model") and key not in stored_env:  # records before stops 44 and 53 lack them
            continue
        if stored_env.get(key) != now_env.get(key):
            lines.append(f"{key}: stored {stored_env.get(key)}, now {now_env.get(key)}")
    stored_packages, now_packages = stored_env.get("packages", {}), now_env.get("packages", {})
    for name in sorted(stored_packages.keys() & now_packages.keys()):  # older records list fewer
        if stored_packages[name] != now_packages[name]:
            lines.append(f"{name}: stored {stored_packages[name]}, now {now_packages[name]}")
    if stored_env.get("git_sha") != now_env.get("git_sha"):
        lines.append(f"code: stored {_short(stored_env.get('git_sha'))}, now {_short(now_env.get('git_sha'))}")
    return lines


def _short(sha: Any) -> str:
    return str(sha)[:7] if sha else "unknown"


def effective_differences(stored: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``effective`` entries (trainer settings as they took effect, the data's versions) that differ."""
    lines = []
    for key in sorted(stored.keys() | now.keys()):
        if key == "data":
            if "data" not in stored:  # cells before stop 42 lack it
                continue
            for name in sorted(stored.get("data", {}).keys() | now.get("data", {}).keys()):
                a, b = stored.get("data", {}).get(name), now.get("data", {}).get(name)
                if a != b:
                    lines.append(f"data {name}: stored {a}, now {b}")
        elif key in stored and stored.get(key) != now.get(key):  # cells before stop 41 lack the section
            lines.append(f"trainer {key}: stored {stored.get(key)}, now {now.get(key)}")
    return lines


def reproduce_cell(
    directory: Path, epochs: int, data_root: Path | None = None, progress: bool = False,
    expected_rows: list[dict[str, str]] | None = None,
) -> Reproduction:  # fmt: skip
    """Train the cell in ``directory`` again for ``epochs`` epochs (in a temporary folder; the
    cell is not touched) and compare the rows of its metrics.csv, or ``expected_rows`` where
    given (what another machine's arithmetic makes of the cell: the records sentinel's rows of
    CPUs that round differently from the records')."""
    cell = store.read_cell(directory)
    record = cell.record
    label = f"{record.task} · {record.method} · seed {record.seed}" if record else str(directory)
    result = Reproduction(Path(directory), label)
    if record is None or record.status != store.STATUS_OK:
        result.skipped = f"not a trained cell ({record.status if record else 'no readable result.json'})"
        return result
    if cell.config is None:
        result.skipped = cell.problem
        return result
    if not (Path(directory) / METRICS_FILE).is_file():
        result.skipped = f"its {METRICS_FILE} is missing"
        return result
    config, make_encoding = cell_setup(cell.config)
    config.trainer.logger = ["csv"]  # a check, not a run: nothing goes to the experiment trackers
    if ddp.launches_ranks(config.trainer):
        result.skipped = "fitted on several devices: reproduce trains in one process"
        return result
    stored_env = _read_json(Path(directory) / "env.json")
    task = get_task(config.task)(config, data_root)
    try:
        task.check_data()
    except (FileNotFoundError, ValueError) as err:  # a real dataset that is not here: the next cell
        result.skipped = str(err).splitlines()[0]
        return result
    with tempfile.TemporaryDirectory(prefix="pe-bench-reproduce-") as tmp:
        # the thread count the cell recorded: CPU reductions are summed in another order otherwise
        with torch_threads(stored_env.get("torch_threads")), lightning_interrupts_kept():
            _, module, data = model_parts(task, make_encoding, record.seed)
            trainer, _, loggers = fit_trainer(task, Path(tmp), progress, "", None, [StopAfterEpochs(epochs)])
            try:
                trainer.fit(module, datamodule=data)
            finally:
                close_loggers(loggers)
            now_env = store.environment()
        now_rows = read_metrics(Path(tmp) / METRICS_FILE) if (Path(tmp) / METRICS_FILE).is_file() else []
    result.rows = now_rows
    stored_rows = read_metrics(Path(directory) / METRICS_FILE) if expected_rows is None else expected_rows
    result.compared, result.differences = compare_rows(stored_rows, now_rows, epochs)
    now_effective = effective_trainer(config) | {"threads": now_env["torch_threads"]}
    if data_fingerprint := task.data_fingerprint():
        now_effective["data"] = data_fingerprint
    result.environment = environment_differences(stored_env, now_env)
    result.environment += effective_differences(cell.config.get(EFFECTIVE, {}), now_effective)
    return result


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def report_line(result: Reproduction) -> list[str]:
    if result.skipped:
        return [f"  skipped    {result.label}: {result.skipped}"]
    if result.identical:
        lines = [f"  identical  {result.label}: {result.compared} epoch(s), every column bit for bit"]
    else:
        lines = [f"  differs    {result.label}:"] + [f"      {line}" for line in result.differences]
    if result.environment:
        lines.append("      environment against the stored cell: " + "; ".join(result.environment))
    return lines


def reproduce(
    cells: list[Path], epochs: int, data_root: Path | None = None, progress: bool = False,
    say: Callable[[str], None] = print,
) -> list[Reproduction]:  # fmt: skip
    quiet_lightning()
    results = []
    for directory in cells:
        result = reproduce_cell(directory, epochs, data_root, progress)
        for line in report_line(result):
            say(line)
        results.append(result)
    return results
