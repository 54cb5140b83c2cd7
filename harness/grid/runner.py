"""Runs a grid of cells (task x method x seed at one profile), one Lightning run per cell.

Protocol of PaPE Section 5.1: validate every epoch, keep the best-validation checkpoint,
report the test metric of that checkpoint. Finished cells are skipped on re-runs; a cell
that fails or diverges is recorded with its reason and the grid goes on.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from pe_bench.adapters import EncodingFactory
from pe_bench.tasks import Task, get_task

from ..config import RunConfig, deep_merge, load_run_config
from ..module import DivergedError
from ..reports.tables import write_extra_tables
from . import store
from .loggers import close_loggers, make_loggers
from .methods import MethodSpec
from .progress import EpochLog, best_epoch, print_flushed


@dataclass
class GridRequest:
    tasks: list[str]
    methods: list[MethodSpec]
    profile: str = "tiny"
    seeds: list[int] = field(default_factory=lambda: [0])
    out: Path = Path("results")
    data_root: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # for every task
    progress: bool = False  # Lightning's progress bar (only on a terminal)
    task_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> its own, over ``overrides``

    def overrides_for(self, task: str) -> dict[str, Any]:
        """The grid-wide overrides with the task's own on top."""
        return deep_merge(self.overrides, self.task_overrides.get(task, {}))


def quiet_lightning() -> None:
    """Keep the console for results: Lightning's info banners and known benign warnings off."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for pattern in (
        ".*does not have many workers.*",
        ".*is deprecated.*",
        ".*LeafSpec.*",
        ".*Checkpoint directory.*exists and is not empty.*",
        ".*number of training batches.*smaller than the logging interval.*",
    ):
        warnings.filterwarnings("ignore", message=pattern)


def resolve_precision(config: RunConfig) -> str:
    if config.trainer.precision != "auto":
        return config.trainer.precision
    on_gpu = torch.cuda.is_available() and config.trainer.accelerator in ("auto", "gpu", "cuda")
    return "bf16-mixed" if on_gpu else "32-true"


def _train_and_test(
    task: Task, make_encoding: EncodingFactory, seed: int, workdir: Path, progress: bool, run_name: str = "",
    grid: Path | None = None,
) -> dict:  # fmt: skip
    """Fit with validation every epoch, test the best-validation checkpoint. ``run_name``
    (``task/method/seedN``) and ``grid`` (the results folder) name the run for trackers."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    config = task.config
    L.seed_everything(seed, workers=True, verbose=False)
    model = task.build_model(make_encoding)
    module = task.lightning_module(model)
    data = task.datamodule(seed)
    monitor = f"val/{task.metric}"
    checkpoint = ModelCheckpoint(
        dirpath=workdir,
        filename="best",
        monitor=monitor,
        mode="max" if task.higher_is_better else "min",
        save_top_k=1,
        save_weights_only=True,
        enable_version_counter=False,
    )
    # metrics.csv, one row per epoch; without progress bars also a printed line per epoch.
    epochs = EpochLog(workdir, monitor, task.metric_label, task.score_scale, say=None if progress else print_flushed)
    loggers = make_loggers(config.trainer.logger, workdir, run_name, grid)
    trainer = L.Trainer(
        max_epochs=config.optim.epochs,
        accelerator=config.trainer.accelerator,
        devices=config.trainer.devices,
        strategy=config.trainer.strategy,
        num_nodes=config.trainer.num_nodes,
        precision=resolve_precision(config),
        gradient_clip_val=config.optim.grad_clip,
        max_time=config.trainer.max_time,
        callbacks=[checkpoint, epochs],
        logger=loggers or False,
        default_root_dir=workdir,
        enable_progress_bar=progress,
        enable_model_summary=False,
        log_every_n_steps=10,
    )
    try:
        start = time.perf_counter()
        trainer.fit(module, datamodule=data)
        train_seconds = time.perf_counter() - start
        if not checkpoint.best_model_path:
            raise RuntimeError(f"no checkpoint was saved: {monitor} was never logged")
        tested = trainer.test(module, datamodule=data, ckpt_path=checkpoint.best_model_path, verbose=False)
    finally:
        close_loggers(loggers)
    best_val = checkpoint.best_model_score
    # Optional hook: a task's module may report more than its one metric (e.g. WER per
    # duration bin); it lands in the cell record's ``extra``.
    extra_results = getattr(module, "extra_results", None)
    return {
        "extra_results": dict(extra_results()) if callable(extra_results) else {},
        "test": float(tested[0][f"test/{task.metric}"]),
        "best_val": None if best_val is None else float(best_val),
        "best_epoch": best_epoch(checkpoint.best_model_path),
        "train_seconds": train_seconds,
        "parameters": sum(p.numel() for p in model.parameters()),
        "positional_parameters": sum(p.numel() for n, p in model.named_parameters() if _is_positional(n)),
    }


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """``trainer.threads`` for one cell (None keeps torch's setting)."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _is_positional(name: str) -> bool:
    return "encoding" in name.split(".")


def run_cell(request: GridRequest, task_name: str, method: MethodSpec, seed: int) -> store.CellRecord:
    """Train and evaluate one cell; always returns (and stores) a complete record."""
    final = store.cell_dir(request.out, task_name, method.label, seed)
    config = load_run_config(task_name, request.profile, request.overrides_for(task_name))
    task = get_task(task_name)(config, request.data_root)
    scale = task.score_scale
    base = {
        "task": task_name,
        "method": method.label,
        "seed": seed,
        "profile": request.profile,
        "metric": task.metric,
        "metric_label": task.metric_label,
        "higher_is_better": task.higher_is_better,
    }
    make_encoding = method.encoding(config.methods.get(method.name))
    reason = make_encoding.unsupported_reason(task.geometry())
    if reason:
        record = store.CellRecord(status=store.STATUS_NA, reason=reason, **base)
        store.write_record(final, record)
        return record
    options = dict(make_encoding.options)
    staging = store.staging_dir(final)
    try:
        task.check_data()
        with torch_threads(config.trainer.threads):
            run_name = f"{task_name}/{method.label}/seed{seed}"
            result = _train_and_test(task, make_encoding, seed, staging, request.progress, run_name, request.out)
            environment = store.environment()  # as the cell ran (threads included)
    except Exception as err:  # the grid must go on: record why this cell has no result
        status = store.STATUS_DIVERGED if isinstance(err, DivergedError) else store.STATUS_FAILED
        record = store.CellRecord(
            status=status,
            reason=f"{type(err).__name__}: {err}",
            extra={"traceback": traceback.format_exc(limit=8)},
            **base,
        )
        store.promote(staging, final)
        store.write_record(final, record)
        return record
    (staging / "config.yaml").write_text(yaml.safe_dump(resolved_config(config, method, options), sort_keys=False))
    store.write_json_atomic(staging / "env.json", environment)
    best_val = result["best_val"]
    record = store.CellRecord(
        status=store.STATUS_OK,
        score=result["test"] * scale,
        best_val=None if best_val is None else best_val * scale,
        best_epoch=result["best_epoch"],
        train_seconds=result["train_seconds"],
        extra={k: result[k] for k in ("parameters", "positional_parameters")} | result["extra_results"],
        **base,
    )
    store.write_record(staging, record)
    store.promote(staging, final)
    return record


def resolved_config(config: RunConfig, method: MethodSpec, options: dict) -> dict[str, Any]:
    """What a cell ran with, as stored in its config.yaml."""
    return config.model_dump(mode="json") | {"method": method.label, "encoding": method.name, "options": options}


# Settings a finished cell may differ in and still be reused: only those that cannot change
# what it measures. Everything else counts, the ``trainer`` section included: precision and
# accelerator change the arithmetic, devices/num_nodes/strategy the global batch and its
# reduction, threads the order of CPU reductions, max_time where training stops, and
# num_workers the random augmentations (each data-loader worker draws from its own seeded
# stream, so 0 and 4 workers crop and flip differently).
_UNCOMPARED = frozenset(
    {
        "methods",  # every method's options; the cell's own are compared under ``options``
        "trainer.logger",  # experiment trackers only watch the run
    }
)
# Typed sections: a key missing from an older cell's file is a field added to the code since,
# at its default. ``data`` and ``options`` are free-form: a missing key there is a real change.
_TYPED = ("model", "optim", "trainer")


def config_differences(stored: dict[str, Any], requested: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between a stored cell config and a requested one."""
    differences = []
    for key in sorted(set(stored) | set(requested)):
        dotted = f"{prefix}{key}"
        if dotted in _UNCOMPARED:
            continue
        if key not in stored and prefix.split(".")[0] in _TYPED:
            continue
        old, new = stored.get(key), requested.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            differences += config_differences(old, new, f"{dotted}.")
        elif old != new:
            differences.append(f"{dotted}: {old!r} stored, {new!r} requested")
    return differences


def check_consistency(request: GridRequest) -> None:
    """A finished cell is only skipped if it ran what is asked now: same profile and config.
    Otherwise the grid would silently report results of another setting (e.g. a study's)."""
    for task_name in request.tasks:
        config = load_run_config(task_name, request.profile, request.overrides_for(task_name))
        for method in request.methods:
            options = method.merged_options(config.methods.get(method.name))
            requested = resolved_config(config, method, options)
            for seed in request.seeds:
                cell = store.cell_dir(request.out, task_name, method.label, seed)
                existing = store.read_record(cell)
                if existing and existing.profile != request.profile:
                    raise ValueError(
                        f"{request.out} already holds {existing.profile!r}-profile results for "
                        f"{task_name}/{method.label}/seed{seed}; use another --out for the {request.profile!r} profile"
                    )
                stored_path = cell / "config.yaml"
                if not existing or existing.status != store.STATUS_OK or not stored_path.is_file():
                    continue
                differences = config_differences(yaml.safe_load(stored_path.read_text()), requested)
                if differences:
                    raise ValueError(
                        f"{cell} was trained with another configuration ("
                        + "; ".join(differences[:3])
                        + (f"; {len(differences) - 3} more" if len(differences) > 3 else "")
                        + "). Use another --out for this setting, or delete that cell to retrain it."
                    )


def run_grid(request: GridRequest, say: Callable[[str], None] = print) -> list[store.CellRecord]:
    quiet_lightning()
    check_consistency(request)
    cells = [(t, m, s) for t in request.tasks for m in request.methods for s in request.seeds]
    records = []
    for index, (task_name, method, seed) in enumerate(cells, 1):
        where = f"[{index}/{len(cells)}] {task_name} · {method.label} · seed {seed}"
        existing = store.read_record(store.cell_dir(request.out, task_name, method.label, seed))
        if existing and existing.status in (store.STATUS_OK, store.STATUS_NA):
            say(f"{where}: finished earlier, skipped")
            records.append(existing)
            continue
        if existing:
            say(f"{where}: retrying (last time {existing.status}: {existing.reason.splitlines()[0][:120]})")
        start = time.perf_counter()
        record = run_cell(request, task_name, method, seed)
        records.append(record)
        elapsed = time.perf_counter() - start
        if record.status == store.STATUS_OK:
            say(f"{where}: {record.metric_label} {record.score:.2f} ({elapsed:.0f}s)")
        else:
            say(f"{where}: {record.status} - {record.reason.splitlines()[0][:200]}")
        sys.stdout.flush()
    # Tasks' own tables beyond the matrix (speech: WER per duration bin), from every stored cell.
    write_extra_tables(request.out, store.load_records(request.out))
    return records
