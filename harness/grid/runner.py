"""Runs a grid of cells (task x method x seed at one profile), one Lightning run per cell.

Protocol of PaPE Section 5.1: validate every epoch, keep the best-validation checkpoint,
report the test metric of that checkpoint. Finished cells are skipped on re-runs; a cell
that fails or diverges is recorded with its reason and the grid goes on. Each cell is trained
under its lock (store.CellLock), so several processes on one results folder share the work.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch import Callback

from pe_bench.adapters import EncodingFactory
from pe_bench.adapters.base import positional_parameters
from pe_bench.adapters.init_stream import paired_initialisation
from pe_bench.tasks import Task, get_task

from ..attention import AUTO_ON_CUDA, set_attention_kernel
from ..compile import compile_enabled, maybe_compile, trains_on_cuda
from ..config import RunConfig, deep_merge, load_run_config, profile_section
from ..config_diff import ABSENT, EFFECTIVE, RESOLVED_OPTIONS, config_differences
from ..module import DivergedError
from ..reports.tables import write_extra_tables
from . import ddp, store
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
    # Cells locked by another process: a lock of another host is stale after this long without
    # its owner's heartbeat (CellLock); the grid checks every poll_seconds whether they are done.
    lock_stale_after: float = 600.0
    poll_seconds: float = 5.0
    # Who trains the pending cells (harness/grid/executor.py): None = this process, one after
    # the other; otherwise e.g. ParallelExecutor(jobs=4) or RayExecutor(address).
    executor: Any = None
    task_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> its own, over ``overrides``
    # task -> its YAML profile as read when the grid started (``pin_profiles``). Every cell is
    # built from it, in this process or in a worker: a task YAML edited while the grid runs
    # would otherwise give the cells that start later another configuration.
    profile_sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def overrides_for(self, task: str) -> dict[str, Any]:
        """The grid-wide overrides with the task's own on top."""
        return deep_merge(self.overrides, self.task_overrides.get(task, {}))

    def pin_profiles(self) -> None:
        """Read every task's YAML profile now, once, for the whole grid."""
        for task in self.tasks:
            if task not in self.profile_sections:
                self.profile_sections[task] = profile_section(task, self.profile)

    def run_config(self, task: str) -> RunConfig:
        """What a cell of ``task`` runs: its pinned profile (or the YAML as it reads now, when
        not pinned) with the overrides."""
        return load_run_config(task, self.profile, self.overrides_for(task), self.profile_sections.get(task))


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
        # A DDP cell's other epoch-level logs are rank 0's share, by design (harness/grid/ddp.py).
        ".*when logging on epoch level in distributed setting.*",
    ):
        warnings.filterwarnings("ignore", message=pattern)


def resolve_precision(config: RunConfig) -> str:
    if config.trainer.precision != "auto":
        return config.trainer.precision
    return "bf16-mixed" if trains_on_cuda(config.trainer) else "32-true"


def resolve_attention_kernel(config: RunConfig) -> str:
    """``trainer.attention_kernel`` as it takes effect for the bias encodings: "dense",
    "flex", or on CUDA auto's rule (``AUTO_ON_CUDA``: by the size of the dense bias)."""
    kernel, on_cuda = config.trainer.attention_kernel, trains_on_cuda(config.trainer)
    if kernel == "auto":
        return AUTO_ON_CUDA if on_cuda else "dense"
    if kernel == "flex" and not on_cuda:
        raise ValueError(
            f"trainer.attention_kernel: flex trains on CUDA only (torch {torch.__version__}'s "
            "FlexAttention has no backward on CPU), and this cell trains on the CPU; set it to "
            "auto or dense (the same function, the N x N bias in memory)"
        )
    return kernel


def effective_trainer(config: RunConfig) -> dict[str, Any]:
    """How the cell's ``trainer`` settings took effect on the machine that trains it, stored
    in its config.yaml as ``effective``. ``auto`` (the default of precision, compile and
    devices) means bf16 and compiled on a GPU but fp32 and eager on a CPU, and every GPU of
    the machine (DDP: a larger global batch): two cells asking for the same configuration can
    have run differently, which the tables must be able to show (harness/config_diff.py).
    ``attention_kernel`` is the bias encodings' kernel (``resolve_attention_kernel``), for
    every method (cells of one task should compare equal whichever encoding they hold)."""
    return {
        "precision": resolve_precision(config),
        "compile": compile_enabled(config.trainer),
        "attention_kernel": resolve_attention_kernel(config),
        "world_size": ddp.probe_trainer(config.trainer).world_size,
    }


def model_parts(task: Task, make_encoding: EncodingFactory, seed: int) -> tuple[Any, Any, Any]:
    """The cell's model, Lightning module and data module, seeded."""
    import lightning as L

    L.seed_everything(seed, workers=True, verbose=False)
    resolve_attention_kernel(task.config)  # refuses flex where it cannot train
    paired = paired_initialisation(seed) if task.config.model.paired_init else nullcontext()
    with paired:  # model.paired_init: the encoding's initial values from a stream of its own
        built = task.build_model(make_encoding)
    model = set_attention_kernel(built, task.config.trainer.attention_kernel)
    model = maybe_compile(model, task.config.trainer)  # trainer.compile (auto: on CUDA)
    return model, task.lightning_module(model), task.datamodule(seed)


def fit_trainer(
    task: Task, workdir: Path, progress: bool, run_name: str, grid: Path | None, callbacks: list[Any]
) -> tuple[Any, Any, list[Any]]:
    """The Trainer of a cell's fit (as ``trainer`` asks), its best-validation checkpoint and
    its trackers."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    config = task.config
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
        callbacks=[checkpoint, epochs, *callbacks],
        logger=loggers or False,
        default_root_dir=workdir,
        enable_progress_bar=progress,
        enable_model_summary=False,
        log_every_n_steps=10,
    )
    return trainer, checkpoint, loggers


TIME_CAP = "trainer.max_time"
FIT_LENGTH = "fit_length.json"  # a DDP cell's rank 0 writes FitLength's numbers here for the grid process


def fit_length(trainer: Any) -> dict[str, Any]:
    """How much of its schedule a finished ``trainer.fit`` ran, for the cell record:
    ``epochs_run`` (optimizer steps taken over steps per epoch, floored at 2 decimals, so a
    last epoch cut mid-way counts as a fraction), ``epochs_planned`` and ``stopped_by``
    (``trainer.max_time`` when Lightning's time cap ran out before the planned steps were
    taken: it stops training quietly, and the best checkpoint so far is then tested)."""
    from lightning.pytorch.callbacks import Timer

    planned_epochs = trainer.max_epochs
    try:
        planned_steps = float(trainer.estimated_stepping_batches)
    except Exception:  # no length known: count the epochs Lightning counts
        planned_steps = math.inf
    steps = trainer.global_step
    if math.isfinite(planned_steps) and planned_steps > 0 and planned_epochs and planned_epochs > 0:
        short = steps < planned_steps
        epochs_run = math.floor(steps / (planned_steps / planned_epochs) * 100) / 100
    else:
        short = trainer.current_epoch < planned_epochs
        epochs_run = float(trainer.current_epoch)
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    remaining = None if timer is None else timer.time_remaining("train")
    timed_out = remaining is not None and remaining <= 0
    if short:  # a last step short must not read as complete
        epochs_run = min(epochs_run, planned_epochs - 0.01)
    return {
        "epochs_run": epochs_run if short else float(planned_epochs),
        "epochs_planned": planned_epochs,
        "stopped_by": TIME_CAP if short and timed_out else "",
    }


class FitLength(Callback):
    """A DDP cell's ``fit_length``, written to ``path`` by global rank 0 at the end of its fit
    (at ``on_fit_end``, in whichever process the launcher made rank 0), for the grid process."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self.path.write_text(json.dumps(fit_length(trainer)))


def _read_fit_length(workdir: Path) -> dict[str, Any]:
    """What a DDP cell's rank 0 wrote (``FitLength``), removed from the cell; {} if nothing."""
    path = Path(workdir) / FIT_LENGTH
    try:
        length = json.loads(path.read_text())
    except (OSError, ValueError):
        length = {}
    path.unlink(missing_ok=True)
    return length if isinstance(length, dict) else {}


def _cell_result(task: Task, model: Any, module: Any, data: Any, tested: list[dict], fitted: dict) -> dict:
    """The cell's numbers: the test metric of the best checkpoint and ``fitted`` (best_val,
    best_epoch, train_seconds, the data module's extra results during the fit, if known)."""
    # Optional hook: a task's module may report more than its one metric (e.g. WER per
    # duration bin), its data module what the data did (e.g. corrupt samples skipped); both
    # land in the cell record's ``extra``.
    extra = {}
    for part in (module, data):
        extra_results = getattr(part, "extra_results", None)
        extra |= dict(extra_results()) if callable(extra_results) else {}
    for key, value in fitted.get("data_extra", {}).items():  # counts of a fit in other processes add up
        extra[key] = extra.get(key, 0) + value if isinstance(value, int | float) else value
    test = float(tested[0][f"test/{task.metric}"])
    if not math.isfinite(test):  # e.g. a 16-bit evaluation that overflowed: no score to rank
        raise DivergedError(f"non-finite test/{task.metric} ({test}) of the best-validation checkpoint")
    return {
        "extra_results": extra,
        "test": test,
        "best_val": fitted["best_val"],
        "best_epoch": fitted["best_epoch"],
        "train_seconds": fitted["train_seconds"],
        **{key: fitted.get(key) for key in ("epochs_run", "epochs_planned")},
        "stopped_by": fitted.get("stopped_by") or "",
        "parameters": sum(p.numel() for p in model.parameters()),
        "positional_parameters": sum(p.numel() for _, p in positional_parameters(model)),
    }


def _train_and_test(
    task: Task, make_encoding: EncodingFactory, seed: int, workdir: Path, progress: bool, run_name: str = "",
    grid: Path | None = None, cell: dict[str, Any] | None = None,
) -> dict:  # fmt: skip
    """Fit with validation every epoch, test the best-validation checkpoint. ``run_name``
    (``task/method/seedN``) and ``grid`` (the results folder) name the run for trackers.
    A cell on several devices is fitted by its own ranks (harness/grid/ddp.py), which
    rebuild it from ``cell`` (task, profile, overrides, data_root, method)."""
    if ddp.launches_ranks(task.config.trainer):
        if cell is None:
            raise ValueError("a DDP cell needs its description (cell=...): its ranks rebuild it from that")
        ranks = cell | {"seed": seed, "workdir": str(workdir), "progress": progress, "run_name": run_name}
        fitted = ddp.fit_in_ranks(workdir, ranks | {"grid": None if grid is None else str(grid)})
        fitted |= _read_fit_length(workdir)
        return _test_fitted(task, make_encoding, seed, workdir, progress, fitted)
    model, module, data = model_parts(task, make_encoding, seed)
    trainer, checkpoint, loggers = fit_trainer(task, workdir, progress, run_name, grid, [])
    try:
        start = time.perf_counter()
        trainer.fit(module, datamodule=data)
        train_seconds = time.perf_counter() - start
        length = fit_length(trainer)  # before the test, which reuses the trainer
        if not checkpoint.best_model_path:
            cap = f" ({TIME_CAP} stopped training before the first validation)" if length["stopped_by"] else ""
            raise RuntimeError(f"no checkpoint was saved: val/{task.metric} was never logged{cap}")
        tested = trainer.test(module, datamodule=data, ckpt_path=checkpoint.best_model_path, verbose=False)
    finally:
        close_loggers(loggers)
    best_val = checkpoint.best_model_score
    fitted = {
        "best_val": None if best_val is None else float(best_val),
        "best_epoch": best_epoch(checkpoint.best_model_path),
        "train_seconds": train_seconds,
    } | length
    return _cell_result(task, model, module, data, tested, fitted)


def fit_ranks(
    task: Task, make_encoding: EncodingFactory, seed: int, workdir: Path, progress: bool, run_name: str,
    grid: Path | None, summary: Any,
) -> None:  # fmt: skip
    """The fit of one rank of a DDP cell (``python -m pe_bench.harness.grid.ddp``); rank 0
    writes the checkpoint, metrics.csv and the ``summary`` callback's file."""
    _, module, data = model_parts(task, make_encoding, seed)
    ddp.local_metrics(module)
    trainer, _, loggers = fit_trainer(
        task, workdir, progress, run_name, grid, [summary, FitLength(workdir / FIT_LENGTH)]
    )
    try:
        trainer.fit(module, datamodule=data)
    finally:
        close_loggers(loggers)


def _test_fitted(
    task: Task, make_encoding: EncodingFactory, seed: int, workdir: Path, progress: bool, fitted: dict
) -> dict:  # fmt: skip
    """Test a cell fitted by its DDP ranks here, on one device: every test sample once."""
    import lightning as L

    config = task.config
    if not fitted["best_path"]:
        raise RuntimeError(f"no checkpoint was saved: val/{task.metric} was never logged")
    model, module, data = model_parts(task, make_encoding, seed)
    devices = config.trainer.devices
    tester = L.Trainer(
        accelerator=config.trainer.accelerator,
        devices=devices[:1] if isinstance(devices, list) else 1,  # the first of the cell's devices
        precision=resolve_precision(config),
        logger=False,  # the trackers have the fit; the test metric is in the cell record
        default_root_dir=workdir,
        enable_progress_bar=progress,
        enable_model_summary=False,
    )
    tested = tester.test(module, datamodule=data, ckpt_path=fitted["best_path"], verbose=False)
    return _cell_result(task, model, module, data, tested, fitted)


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


@contextmanager
def lightning_interrupts_kept() -> Iterator[None]:
    """Lightning answers Ctrl-C during fit or test with ``sys.exit(1)`` (and ignores further
    Ctrl-Cs; lightning.pytorch.trainer.call). Turn that back into KeyboardInterrupt, so the
    grid cleans up and the CLI reports the interruption (exit status 130)."""
    try:
        yield
    except SystemExit as exit_:
        if not isinstance(exit_.__context__, KeyboardInterrupt):
            raise
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt from None


def run_cell(
    request: GridRequest, task_name: str, method: MethodSpec, seed: int, lock: store.CellLock | None = None
) -> store.CellRecord:
    """Train and evaluate one cell; always returns (and stores) a complete record.

    The caller holds the cell's ``lock``: given, it is checked before the result replaces the
    cell (a lock broken as stale meanwhile means another process owns the cell now).
    A KeyboardInterrupt leaves nothing of the attempt behind and propagates."""
    final = store.cell_dir(request.out, task_name, method.label, seed)
    config = request.run_config(task_name)
    task = get_task(task_name)(config, request.data_root)
    base = {
        "task": task_name,
        "method": method.label,
        "seed": seed,
        "profile": request.profile,
        "metric": task.metric,
        "metric_label": task.metric_label,
        "higher_is_better": task.higher_is_better,
        "trained_by": store.trained_by(),
    }
    make_encoding = method.encoding(config.methods.get(method.name))
    reason = make_encoding.unsupported_reason(task.geometry())
    if reason:
        record = store.CellRecord(status=store.STATUS_NA, reason=reason, **base)
        store.write_record(final, record)
        return record
    staging = store.staging_dir(final)
    try:
        record = _train_into(staging, task, config, method, make_encoding, seed, base, request)
        if lock is not None and lock.lost:
            raise store.CellBusyError(f"the lock of {final} was broken while this process trained it; result discarded")
    except BaseException:  # Ctrl-C or a lost lock: nothing of this attempt is kept
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        store.promote(staging, final)
    except FileNotFoundError as err:
        if staging.exists():
            raise
        # the lock was broken just after the check above, and its new owner removed our folder
        message = f"the lock of {final} was broken while this process trained it; result discarded"
        raise store.CellBusyError(message) from err
    return record


def _train_into(
    staging: Path, task: Task, config: RunConfig, method: MethodSpec, make_encoding: EncodingFactory, seed: int,
    base: dict[str, Any], request: GridRequest,
) -> store.CellRecord:  # fmt: skip
    """Train in ``staging`` and write the cell's files and record there; a failure or
    divergence becomes the record (the grid goes on)."""
    try:
        task.check_data()
        with torch_threads(config.trainer.threads), lightning_interrupts_kept():
            run_name = f"{base['task']}/{method.label}/seed{seed}"  # the trackers' run name
            cell = {
                "task": base["task"],
                "method": method.label,
                "profile": request.profile,
                "overrides": request.overrides_for(base["task"]),
                "profile_section": request.profile_sections.get(base["task"]),
                "data_root": None if request.data_root is None else str(request.data_root),
            }  # what the ranks of a DDP cell rebuild it from
            effective = effective_trainer(config)
            result = _train_and_test(task, make_encoding, seed, staging, request.progress, run_name, request.out, cell)
            environment = store.environment()  # as the cell ran (threads included)
            # trainer.threads null trains with the machine's count: CPU reductions sum in
            # another order on another count, so the count that took effect is the setting
            effective["threads"] = environment["torch_threads"]
            data = task.data_fingerprint()  # after training: the data exists now
            if data:
                effective["data"] = data
    except Exception as err:  # the grid must go on: record why this cell has no result
        status = store.STATUS_DIVERGED if isinstance(err, DivergedError) else store.STATUS_FAILED
        record = store.CellRecord(
            status=status,
            reason=f"{type(err).__name__}: {err}",
            extra={"traceback": traceback.format_exc(limit=8)},
            **base,
        )
        store.write_record(staging, record)
        return record
    options = dict(make_encoding.options)
    stored_config = resolved_config(config, method, options) | {EFFECTIVE: effective}
    (staging / store.CONFIG).write_text(yaml.safe_dump(stored_config, sort_keys=False))
    store.write_json_atomic(staging / "env.json", environment)
    scale = task.score_scale
    best_val = result["best_val"]
    record = store.CellRecord(
        status=store.STATUS_OK,
        score=result["test"] * scale,
        best_val=None if best_val is None else best_val * scale,
        best_epoch=result["best_epoch"],
        train_seconds=result["train_seconds"],
        epochs_run=result["epochs_run"],
        epochs_planned=result["epochs_planned"],
        stopped_by=result["stopped_by"],
        extra={k: result[k] for k in ("parameters", "positional_parameters")} | result["extra_results"],
        **base,
    )
    store.write_record(staging, record)
    return record


def resolved_config(config: RunConfig, method: MethodSpec, options: dict) -> dict[str, Any]:
    """What a cell ran with, as stored in its config.yaml: ``options`` as given (what a cell is
    rebuilt from) and ``resolved_options``, every option with the defaults of the code that
    trained it (harness/config_diff.py)."""
    resolved = EncodingFactory(method.name, options).validated().model_dump(mode="json")
    return config.model_dump(mode="json") | {
        "method": method.label,
        "encoding": method.name,
        "options": options,
        RESOLVED_OPTIONS: resolved,
    }


def requested_cell_config(config: RunConfig, method: MethodSpec) -> dict[str, Any]:
    """What a cell of ``method`` under ``config`` would store as its config.yaml (without
    ``effective``): the method's options merged over the task profile's, as resolved_config
    writes them. The one form every reuse check compares a stored cell with."""
    return resolved_config(config, method, method.merged_options(config.methods.get(method.name)))


def cell_setup(stored: dict[str, Any]) -> tuple[RunConfig, EncodingFactory]:
    """The inverse of ``resolved_config``: a stored config.yaml's run configuration and the
    encoding with the cell's own options (``effective`` is a record of how the trainer's
    settings took effect, not a setting)."""
    resolved = {
        k: v for k, v in stored.items() if k not in ("method", "encoding", "options", RESOLVED_OPTIONS, EFFECTIVE)
    }
    return RunConfig(**resolved), EncodingFactory(stored["encoding"], stored["options"])


# Settings a finished cell may differ in and still be reused are only those that cannot change
# what it measures (harness/config_diff.py): experiment trackers. Everything else counts, the
# ``trainer`` section included: precision and accelerator change the arithmetic,
# devices/num_nodes/strategy the global batch and its reduction, threads the order of CPU
# reductions, max_time where training stops, and num_workers the random augmentations (each
# data-loader worker draws from its own seeded stream, so 0 and 4 workers crop and flip
# differently). Every method's options (``methods``) are not compared: the cell's own are, under
# ``options``.
def stored_config_differences(stored: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    """Why a stored cell config is not what is requested now, one line per differing key."""
    return _difference_lines(stored, requested, lambda c: {k: v for k, v in c.items() if k != "methods"})


def _difference_lines(
    stored: dict[str, Any], requested: dict[str, Any], part: Callable[[dict[str, Any]], dict[str, Any]]
) -> list[str]:
    """``part`` of the stored and the requested config compared by harness/config_diff.py's
    rules: ``key: <stored> stored, <requested> requested`` per differing key."""
    task = str(requested.get("task", stored.get("task", "")))
    return [
        f"{key}: {_shown(old)} stored, {_shown(new)} requested"
        for key, old, new in config_differences(task, part(stored), part(requested))
    ]


def _shown(value: Any) -> str:
    return "absent" if value is ABSENT else repr(value)


def requested_run_config(request: GridRequest, task_name: str) -> RunConfig:
    """What a cell of ``task_name`` runs, and stores, under ``request``: the profile with the
    overrides, and the CPU threads of the executor (if any) that will run it."""
    config = request.run_config(task_name)
    if request.executor is None:
        return config
    trainer = config.trainer.model_copy(update={"threads": request.executor.cell_threads(config)})
    return config.model_copy(update={"trainer": trainer})


def option_differences(stored: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    """How a stored cell's own method options (config.yaml's ``options``) differ from those
    requested now, one line per key, by the rules of harness/config_diff.py (a key one side
    lacks differs: an option's default may have changed since the cell was trained; so do the
    ``resolved_options`` both hold, which show a default the code changed)."""
    return _difference_lines(stored, requested, _own_options)


def _own_options(config: dict[str, Any]) -> dict[str, Any]:
    return {key: config.get(key) or {} for key in ("options", RESOLVED_OPTIONS)}


def _check_sibling_options(
    request: GridRequest, task_name: str, method: MethodSpec, requested: dict, to_train: list[int]
) -> None:
    """Seeds ``to_train`` are only trained where their method options equal those of the seeds of
    their (task, method) already stored in the folder: the table averages a row's seeds, so a seed
    of other options (``--set imagenet:methods.rope.base=7``) would be averaged with them
    (the table marks such a cell †, not ranked, but the user asked for another setting)."""
    if not to_train:
        return
    folder = store.cell_dir(request.out, task_name, method.label, 0).parent
    differing: dict[str, list[int]] = {}
    for directory in sorted(folder.glob("seed*")):
        seed_text = directory.name.removeprefix("seed")
        if not seed_text.isdigit() or int(seed_text) in request.seeds:
            continue  # the seeds asked for now are checked on their own (check_consistency)
        stored = store.read_cell(directory)
        if not stored.finished or stored.config is None:
            continue
        for difference in option_differences(stored.config, requested):
            differing.setdefault(difference, []).append(int(seed_text))
    if differing:
        shown = "; ".join(
            f"{difference} (seed {', '.join(map(str, sorted(seeds)))})" for difference, seeds in differing.items()
        )
        raise ValueError(
            f"{folder} holds seeds of {task_name}/{method.label} trained with other options of "
            f"{method.name} ({shown}); seed(s) {', '.join(map(str, to_train))} would be averaged with "
            "them in one table cell. Use another --out for this setting, give it a method label of its own "
            f"(--methods '{method.name}[key=value]'), or delete those seeds to retrain them."
        )


def check_consistency(request: GridRequest) -> None:
    """A finished cell is only skipped if it ran what is asked now: same profile and config.
    Otherwise the grid would silently report results of another setting (e.g. a study's).
    A cell whose config.yaml is missing or damaged is not finished (store.read_cell): it is
    trained again rather than trusted unchecked. A new seed is only trained with the method
    options of the seeds of its (task, method) already stored (``_check_sibling_options``)."""
    for task_name in request.tasks:
        config = requested_run_config(request, task_name)
        for method in request.methods:
            requested = requested_cell_config(config, method)
            to_train = []
            for seed in request.seeds:
                cell = store.cell_dir(request.out, task_name, method.label, seed)
                stored = store.read_cell(cell)
                existing = stored.record
                if existing and existing.profile != request.profile:
                    raise ValueError(
                        f"{request.out} already holds {existing.profile!r}-profile results for "
                        f"{task_name}/{method.label}/seed{seed}; use another --out for the {request.profile!r} profile"
                    )
                if not stored.finished:
                    to_train.append(seed)
                if not stored.finished or stored.config is None:
                    continue
                differences = stored_config_differences(stored.config, requested)
                if differences:
                    raise ValueError(
                        f"{cell} was trained with another configuration ("
                        + "; ".join(differences[:3])
                        + (f"; {len(differences) - 3} more" if len(differences) > 3 else "")
                        + "). Use another --out for this setting, or delete that cell to retrain it."
                    )
            _check_sibling_options(request, task_name, method, requested, to_train)


Cell = tuple[str, MethodSpec, int]


def _cell_dir(request: GridRequest, cell: Cell) -> Path:
    task_name, method, seed = cell
    return store.cell_dir(request.out, task_name, method.label, seed)


def _first_line(text: str, limit: int) -> str:
    return (text.splitlines() or [""])[0][:limit]


def _outcome(record: store.CellRecord) -> str:
    if record.status == store.STATUS_OK:
        cut = f" (cut short: {record.schedule_text()}; not ranked)" if record.cut_short else ""
        return f"{record.metric_label} {record.score:.2f}{cut}"
    return f"{record.status} - {_first_line(record.reason, 200)}"


def _trainer(record: store.CellRecord) -> str:
    who = record.trained_by
    return f"pid {who.get('pid', '?')} on host {who.get('host', '?')}" if who else "another process"


def _record_state(final: Path) -> tuple[int, int, int] | None:
    """Identity of a cell's record file, to notice that another process wrote a new one."""
    try:
        stat = (final / store.RECORD).stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def refuse_another_configuration(request: GridRequest, cell: Cell, stored: store.StoredCell) -> None:
    """A ValueError if the finished ``stored`` cell ran another configuration than ``request``
    asks of it. ``check_consistency`` compares the cells stored when the grid starts; a cell
    another process finishes later (a second ``pe-bench run`` on the same ``--out`` with other
    settings, started before either stored anything) was reused unchecked until stop 71, and
    its score reported as this run's."""
    if stored.config is None or stored.record is None or stored.record.status != store.STATUS_OK:
        return
    task_name, method, _ = cell
    requested = requested_cell_config(requested_run_config(request, task_name), method)
    differences = stored_config_differences(stored.config, requested)
    if differences:
        raise ValueError(
            f"{_cell_dir(request, cell)} was trained by {_trainer(stored.record)} with another configuration "
            f"than this run asks ({'; '.join(differences[:3])}): its result is not this run's. Use another "
            "--out for this setting, or delete that cell to retrain it."
        )


def claim_and_run(
    request: GridRequest, cell: Cell, where: str, say: Callable[[str], None], retry_failed: bool = True
) -> store.CellRecord | store.LockOwner:
    """The cell's record (reused, or trained now under its lock), or the live owner of its lock.
    The unit every executor runs. ``retry_failed=False`` returns a failed or diverged record
    as it is (an executor has just tried the cell)."""
    task_name, method, seed = cell
    final = _cell_dir(request, cell)
    stored = store.read_cell(final)
    if stored.finished:
        refuse_another_configuration(request, cell, stored)
        say(f"{where}: finished earlier, skipped")
        return stored.record
    if not retry_failed and stored.record is not None and not stored.problem:
        say(f"{where}: {_outcome(stored.record)}")
        return stored.record
    lock = store.CellLock(final, stale_after=request.lock_stale_after, say=say)
    if not lock.acquire():
        return lock.owner
    with lock:
        stored = store.read_cell(final)  # another process may have finished it meanwhile
        if stored.finished:
            refuse_another_configuration(request, cell, stored)
            say(f"{where}: finished by {_trainer(stored.record)}, skipped")
            return stored.record
        if stored.problem:
            say(f"{where}: re-running: {stored.problem}")
        elif stored.record:
            say(f"{where}: retrying (last time {stored.record.status}: {_first_line(stored.record.reason, 120)})")
        start = time.perf_counter()
        try:
            record = run_cell(request, task_name, method, seed, lock)
        except store.CellBusyError as err:
            say(f"{where}: {err}")
            return lock.current_owner() or store.LockOwner()
        took = f" ({time.perf_counter() - start:.0f}s)" if record.status == store.STATUS_OK else ""
        say(f"{where}: {_outcome(record)}{took}")
        sys.stdout.flush()
        return record


def run_grid(request: GridRequest, say: Callable[[str], None] = print) -> list[store.CellRecord]:
    """Train every cell not finished yet: one after the other, or by ``request.executor``.

    Several processes may run grids on the same ``out`` (also from several hosts on a shared
    file system): each cell is trained by whoever takes its lock first. A cell locked by a live
    process is passed over; once its own cells are done the grid waits for those, checking
    every ``poll_seconds``, and takes over a cell whose owner stopped without finishing it.
    So every process returns (and prints) the complete grid."""
    quiet_lightning()
    request.pin_profiles()
    check_consistency(request)
    if request.executor is None:  # this process trains: a setting it cannot run fails every cell alike
        for task_name in request.tasks:
            resolve_attention_kernel(requested_run_config(request, task_name))
    cells = [(t, m, s) for t in request.tasks for m in request.methods for s in request.seeds]
    label = {i: f"[{i}/{len(cells)}] {t} · {m.label} · seed {s}" for i, (t, m, s) in enumerate(cells, 1)}
    attempted: set[Cell] = set()
    if request.executor is not None:  # the executor trains the pending cells; the loop below collects them
        attempted = {c for c in cells if not store.read_cell(_cell_dir(request, c)).finished}
        pending = [(t, m.label, s) for t, m, s in cells if (t, m, s) in attempted]
        finished = len(cells) - len(pending)
        say(f"{finished} of {len(cells)} cells finished earlier; {request.executor.describe(len(pending))}")
        request.executor.run(request, pending, say)
    records: dict[int, store.CellRecord] = {}
    elsewhere: dict[int, tuple | None] = {}  # cells locked by others: their record's state then
    for index, cell in enumerate(cells, 1):
        outcome = claim_and_run(request, cell, label[index], say, retry_failed=cell not in attempted)
        if isinstance(outcome, store.CellRecord):
            records[index] = outcome
            continue
        say(f"{label[index]}: running in another process ({outcome.describe()}); waiting for it at the end")
        elsewhere[index] = _record_state(_cell_dir(request, cell))
    if elsewhere:
        every = f"checking every {request.poll_seconds:g}s"
        say(f"waiting for {len(elsewhere)} cell(s) running in other processes ({every})")
    while elsewhere:
        time.sleep(request.poll_seconds)
        for index, before in list(elsewhere.items()):
            final = _cell_dir(request, cells[index - 1])
            if _record_state(final) != before and (stored := store.read_cell(final)).record is not None:
                refuse_another_configuration(request, cells[index - 1], stored)
                record = stored.record
                say(f"{label[index]}: done by {_trainer(record)}: {_outcome(record)}")
            else:  # still running, or its owner stopped without a result: then it is ours now
                record = claim_and_run(request, cells[index - 1], label[index], say)
                if isinstance(record, store.LockOwner):
                    continue
            records[index] = record
            del elsewhere[index]
    # Tasks' own tables beyond the matrix (speech: WER per duration bin), from the cells the matrix ranks.
    write_extra_tables(request.out)
    return [records[i] for i in sorted(records)]
