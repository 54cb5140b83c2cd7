"""The results store: one directory per finished cell, written atomically.

    <out>/runs/<task>/<method>/seed<N>/
        config.yaml    resolved run config (task, profile, model, optim, trainer, data, method options)
        env.json       package versions, git sha, device, threads
        metrics.csv    per-epoch training/validation log (Lightning's CSVLogger)
        best.ckpt      weights of the best-validation checkpoint
        result.json    the record; written last, so its presence means "finished"
    <out>/runs/<task>/<method>/.seed<N>.lock    while a process trains the cell (``CellLock``)

A cell is trained in a hidden sibling directory and renamed into place when done, so an
interrupted run never leaves a half-written cell behind. A record that cannot be read, or a
finished cell whose config.yaml is missing or unreadable, counts as unfinished: it is reported
once (with its path) and the cell is trained again; it never stops a table or a grid.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pydantic
import torch
import yaml

RECORD = "result.json"
CONFIG = "config.yaml"
STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_DIVERGED = "diverged"
STATUS_NA = "n/a"
STATUSES = (STATUS_OK, STATUS_FAILED, STATUS_DIVERGED, STATUS_NA)
HOST = socket.gethostname()


def _process_space() -> str:
    """Which processes a pid names here: the boot and the pid namespace. Containers on one host
    network (Docker --network host, Kubernetes hostNetwork) share the hostname, not the pids:
    a lock's pid is checked against the running processes only within one space ("" elsewhere
    than Linux)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


PROCESS_SPACE = _process_space()


@dataclass
class CellRecord:
    """One cell's outcome. Reading ignores keys this version does not know and fills keys an
    older record lacks with their defaults, so old results folders stay readable."""

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
    trained_by: dict[str, Any] = field(default_factory=dict)  # host, pid, started (ISO time)
    # How much of its schedule the fit ran: epochs (fractional where the last one was cut
    # mid-way) of ``epochs_planned`` (optim.epochs), and what stopped it before the end
    # ("trainer.max_time": Lightning's time cap, which stops quietly). None/"" in records
    # written before these fields existed: those read as complete.
    epochs_run: float | None = None
    epochs_planned: int | None = None
    stopped_by: str = ""

    @property
    def cut_short(self) -> bool:
        """Whether training stopped before its planned schedule ended (a score of a shorter
        fit, not comparable with complete cells). False for records that do not say."""
        if self.stopped_by:
            return True
        return self.epochs_run is not None and self.epochs_planned is not None and self.epochs_run < self.epochs_planned

    def schedule_text(self) -> str:
        """``6.5 of 40 epochs, stopped by trainer.max_time`` ("" for a complete or older record)."""
        if not self.cut_short:
            return ""
        ran = "?" if self.epochs_run is None else f"{self.epochs_run:g}"
        planned = "?" if self.epochs_planned is None else str(self.epochs_planned)
        return f"{ran} of {planned} epochs" + (f", stopped by {self.stopped_by}" if self.stopped_by else "")


_RECORD_SCHEMA = pydantic.TypeAdapter(CellRecord)


def cell_dir(out: Path, task: str, method: str, seed: int) -> Path:
    return Path(out) / "runs" / task / method_dirname(method) / f"seed{seed}"


def method_dirname(method: str) -> str:
    """Method specs like ``pape[m=8]`` become safe directory names (``pape[m=8]`` stays readable)."""
    return "".join(c if c.isalnum() or c in "-_.=[],+" else "_" for c in method)


def write_json_atomic(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def trained_by() -> dict[str, Any]:
    """Who trains a cell: recorded in it, so concurrent runs can be told apart afterwards."""
    return {"host": HOST, "pid": os.getpid(), "started": datetime.now().isoformat(timespec="seconds")}


# --- reading: a damaged file is reported once and read as "nothing usable here" -------------

_reported: set[tuple[str, int, int]] = set()


def report_damaged(path: Path, why: str) -> None:
    """One warning line on stderr per damaged file (and version of it) in this process."""
    try:
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        key = (str(path), 0, 0)
    if key in _reported:
        return
    _reported.add(key)
    print(f"warning: {path} is damaged ({why}); the cell counts as unfinished and `pe-bench run` redoes it",
          file=sys.stderr)  # fmt: skip


def _parse_record(path: Path) -> tuple[CellRecord | None, str]:
    """(record, "") or (None, why it cannot be read)."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"{type(err).__name__}: {err}"
    if not isinstance(payload, dict):
        return None, f"expected a JSON object, found {type(payload).__name__}"
    try:
        record = _RECORD_SCHEMA.validate_python(payload)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"])) or "record"
        return None, f"{where}: {first['msg']}" + (f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else "")
    if record.status not in STATUSES:
        return None, f"status {record.status!r} is none of {', '.join(STATUSES)}"
    return record, ""


def read_record(directory: Path) -> CellRecord | None:
    """The cell's record; None when there is none or it is damaged (then reported once)."""
    path = Path(directory) / RECORD
    if not path.is_file():
        return None
    record, why = _parse_record(path)
    if why:
        report_damaged(path, why)
    return record


def read_config(directory: Path) -> tuple[dict[str, Any] | None, str]:
    """(the cell's resolved config, "") or (None, why there is none usable)."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        return None, f"its {CONFIG} is missing"
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    else:
        if isinstance(config, dict):
            return config, ""
        why = f"expected a mapping, found {type(config).__name__}"
    report_damaged(path, why)
    return None, f"its {CONFIG} is damaged"


@dataclass
class StoredCell:
    """What a cell directory holds, and whether it can be reused instead of training again."""

    record: CellRecord | None  # None: nothing readable stored
    config: dict[str, Any] | None = None  # the resolved config of a trained (ok) cell
    problem: str = ""  # why a stored result cannot be reused ("" when it can, or nothing is stored)

    @property
    def finished(self) -> bool:
        """Trained (with its config, so the configuration check can be made) or n/a."""
        return self.record is not None and not self.problem and self.record.status in (STATUS_OK, STATUS_NA)


def read_cell(directory: Path) -> StoredCell:
    directory = Path(directory)
    path = directory / RECORD
    if not path.is_file():
        return StoredCell(None)
    record = read_record(directory)
    if record is None:
        return StoredCell(None, problem=f"its {RECORD} is damaged")
    if record.status != STATUS_OK:
        return StoredCell(record)
    if record.score is None or not math.isfinite(record.score):
        # The runner stores a non-finite test score as diverged; an ok record holding one
        # (hand-edited, or from older code) is read as diverged by the tables, so it is
        # trained again like a diverged cell rather than kept as a finished one.
        return StoredCell(record, problem=f"its {RECORD} is ok but holds no finite score ({record.score})")
    config, problem = read_config(directory)
    # Without its config a trained cell cannot be checked against what is asked now
    # (check_consistency), so it must not be reused.
    return StoredCell(record, config, problem)


def load_records(out: Path) -> list[CellRecord]:
    """Every readable record under ``out``; damaged ones are reported and left out."""
    runs = Path(out) / "runs"
    if not runs.is_dir():
        return []
    records = (read_record(p.parent) for p in sorted(runs.glob(f"*/*/seed*/{RECORD}")))
    return [r for r in records if r is not None]


def write_record(directory: Path, record: CellRecord) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / RECORD, asdict(record))


# --- training a cell: staging and promotion (only by the holder of the cell's lock) ----------


def _unique() -> str:
    """A name part no other attempt shares: pids repeat across containers and hosts, and a
    process whose lock was broken as stale may still be writing into its folder."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def staging_dir(final: Path) -> Path:
    """A fresh hidden sibling of ``final`` to train in. Call it only while holding the cell's
    ``CellLock``: then every older staging folder, and any cell a promotion left aside, is a
    dead process's leftover. Its name is this attempt's alone, so an owner whose lock was
    broken writes into its own folder, never into this one (until stop 71 both were named by
    pid, and two containers' pid 1 shared one: a record of one run beside the other's files)."""
    for stale in [*final.parent.glob(f".{final.name}.partial-*"), *final.parent.glob(f".{final.name}.replaced-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    staging = final.with_name(f".{final.name}.partial-{_unique()}")
    staging.mkdir(parents=True)
    return staging


def promote(staging: Path, final: Path) -> None:
    """Replace ``final`` with the finished ``staging`` directory (two renames: a reader sees the
    old cell or the new one, or for an instant none; never a mix)."""
    if final.exists():
        old = final.with_name(f".{final.name}.replaced-{_unique()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)


# --- one process per cell: CellLock ----------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a Linux process; None elsewhere or if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the command name may contain spaces and ')'
    return fields[0], fields[19]  # fields 3 and 22 of proc(5)


def process_alive(pid: int, start: str | None = None) -> bool:
    """Whether process ``pid`` of this host runs; ``start`` (its /proc start time when the lock
    was taken) tells a reused pid from the original process."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, started = stat
    return state not in ("Z", "X") and (start is None or started == start)


@dataclass(frozen=True)
class LockOwner:
    """Who holds a cell lock, as written in the lock file."""

    pid: int = 0
    host: str = "?"
    started: str = "?"
    token: str = ""
    process_start: str | None = None
    pid_space: str = ""  # PROCESS_SPACE of the owner ("" in lock files of pe-bench before stop 71)

    def describe(self) -> str:
        if self.token.startswith(_UNREADABLE):
            return "an owner whose lock file cannot be read (yet)"
        return f"pid {self.pid} on host {self.host}, since {self.started}"


_UNREADABLE = "unreadable:"


def _parse_owner(text: str) -> LockOwner:
    try:
        payload = json.loads(text)
        fields = {k: payload[k] for k in ("pid", "host", "started", "token", "process_start")}
        return LockOwner(**fields, pid_space=payload.get("pid_space", ""))
    except (ValueError, KeyError, TypeError):  # empty while its creator writes it, or damaged
        return LockOwner(token=f"{_UNREADABLE}{text}")


class CellBusyError(RuntimeError):
    """The cell is being trained by another live process."""


class CellLock:
    """Exclusive claim of one cell by one process, across processes and hosts sharing ``--out``.

    The lock is the file ``.seed<N>.lock`` next to the cell, created atomically (O_CREAT|O_EXCL)
    with its owner's pid, host and start time. While held, a daemon thread touches it every
    ``heartbeat`` seconds. A lock is stale, and is broken with a message, when its owner is
    on this host (and in this pid namespace) and no longer runs, or elsewhere and has not touched it for
    ``stale_after`` seconds (default 10 minutes: keep it well above ``heartbeat``; the hosts'
    clocks must roughly agree). Only the holder may remove the cell's staging leftovers.

        lock = CellLock(cell)
        if lock.acquire():
            with lock:
                ...             # train the cell
        else:
            print(lock.owner.describe())
    """

    def __init__(self, final: Path, stale_after: float = 600.0, heartbeat: float = 30.0, say=None):
        self.final = Path(final)
        self.path = self.final.with_name(f".{self.final.name}.lock")
        self.stale_after = stale_after
        self.heartbeat = heartbeat
        self.say = say or (lambda message: print(message, file=sys.stderr))
        self.owner: LockOwner | None = None  # the live owner found by the last failed acquire()
        self._token: str | None = None
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self._token is not None

    def acquire(self) -> bool:
        """Take the lock (breaking a stale one); False if a live owner holds it (see ``owner``)."""
        if self.held:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # each retry follows a broken stale lock; a race may need another go
            if self._create():
                return True
            found = self._read()
            if found is None:  # released meanwhile
                continue
            owner, age = found
            why = self._stale_reason(owner, age)
            if why is None:
                self.owner = owner
                return False
            self._break(owner, why)
        self.owner = (self._read() or (LockOwner(), 0.0))[0]
        return False

    def release(self) -> None:
        self._stop.set()
        if self._beater is not None:
            self._beater.join(timeout=5)
        if self._token is not None and not self.lost:
            self.path.unlink(missing_ok=True)
        self._token = None

    def current_owner(self) -> LockOwner | None:
        """Who holds the lock now (None: nobody)."""
        found = self._read()
        return None if found is None else found[0]

    @property
    def lost(self) -> bool:
        """True if the lock file no longer holds this process's claim (it was broken as stale)."""
        found = self._read()
        return found is None or found[0].token != self._token

    def __enter__(self) -> CellLock:
        if not self.acquire():
            raise CellBusyError(f"{self.final} is being trained by {self.owner.describe()}")
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _create(self) -> bool:
        token = uuid.uuid4().hex
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        stat = _proc_stat(os.getpid())
        owner = LockOwner(
            pid=os.getpid(),
            host=HOST,
            started=datetime.now().isoformat(timespec="seconds"),
            token=token,
            process_start=stat[1] if stat else None,
            pid_space=PROCESS_SPACE,
        )
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(asdict(owner)))
        self._token = token
        self._stop = threading.Event()
        self._beater = threading.Thread(target=self._beat, name=f"heartbeat {self.path}", daemon=True)
        self._beater.start()
        return True

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with contextlib.suppress(OSError):  # broken or removed meanwhile: ``lost`` tells the owner
                os.utime(self.path)

    def _read(self) -> tuple[LockOwner, float] | None:
        """(owner, seconds since its last heartbeat), or None if there is no lock file."""
        try:
            age = time.time() - self.path.stat().st_mtime
            return _parse_owner(self.path.read_text()), age
        except FileNotFoundError:
            return None

    def _stale_reason(self, owner: LockOwner, age: float) -> str | None:
        if owner.token.startswith(_UNREADABLE):
            return f"unreadable and untouched for {age:.0f} s" if age > self.stale_after else None
        if owner.host == HOST and owner.pid_space in ("", PROCESS_SPACE):
            return None if process_alive(owner.pid, owner.process_start) else f"process {owner.pid} is gone"
        return f"no heartbeat for {age / 60:.0f} min" if age > self.stale_after else None

    def _break(self, owner: LockOwner, why: str) -> None:
        """Remove the stale lock file judged above, but never a fresh one that replaced it."""
        aside = self.path.with_name(f"{self.path.name}.broken-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if _parse_owner(aside.read_text()).token != owner.token:  # a new owner took it in between: give it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            return
        aside.unlink(missing_ok=True)
        self.say(f"breaking the stale lock {self.path} of {owner.describe()}: {why}")


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
    # the kit's helper, imported here: harness/data.py imports Lightning, which the table
    # commands that read this module need not load
    from pe_bench.harness.data import package_version

    packages = ("pe-bench", "torch", "torchvision", "lightning", "torchmetrics", "pandas", "numpy", "pydantic")
    # those the tasks' data and metrics come from (None where not installed)
    packages += ("torchaudio", "soundfile", "av", "sentencepiece", "sacrebleu", "babel", "num2words")
    packages += ("pycocotools", "scikit-image")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {p: package_version(p) for p in packages},
        "git_sha": git_sha(),
        "device": device_description(),
        "torch_threads": torch.get_num_threads(),
        # the instruction set torch's CPU kernels dispatch to (AVX512, AVX2, ...): another one
        # sums in another order, so a record's bits hold only where this is the same
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        # the CPU itself: two CPUs of one instruction set can still round differently (their
        # libraries block sums by cache sizes; stop 53 met one)
        "cpu_model": cpu_model(),
        "cuda": torch.version.cuda,
    }


def cpu_model() -> str | None:
    """The x86 CPU's "family F model M" from /proc/cpuinfo, None where it says none (not
    Linux, or another architecture)."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return None
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}
    if not (fields.get("cpu family", "").isdigit() and fields.get("model", "").isdigit()):
        return None
    return f"family {fields['cpu family']} model {fields['model']}"
