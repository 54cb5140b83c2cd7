"""Checks of real datasets on disk: class lists, corrupt files, whole-dataset scans.

A dataset that is present but unusable raises :class:`MalformedDatasetError` (a folder or
list is wrong) or :class:`CorruptFileError` (one file cannot be read), and the message
names the file and what is wrong with it. ``pe-bench check-data`` scans every file of a
dataset with :func:`scan_files` and prints a :class:`DataReport`.

Corrupt samples during training follow ``data.max_corrupt_fraction`` (:class:`CorruptSampleLog`):
0 (the default) makes the first corrupt file an error that names it; a fraction f > 0 skips
corrupt samples (each is replaced by the next readable sample of the same split, so batch
shapes and epoch lengths stay as they are), counts them, reports the count in the cell's
record as ``corrupt_samples``, and stops with an error once more than f of the dataset's
files turned out corrupt. Large datasets (ImageNet has a few known-bad JPEGs in some
copies) then train without hand repair, and the record says how many samples were lost.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from pe_bench.harness.config import ConfigError

T = TypeVar("T")

#: names printed in a message before "and N more"
SHOWN_NAMES = 10


class MalformedDatasetError(ValueError):
    """A dataset is present but unusable (lists or folders disagree); the message names the
    files or folders and what is wrong."""


class CorruptFileError(MalformedDatasetError):
    """One file of a dataset cannot be read: ``path`` and ``problem`` say which and why."""

    def __init__(self, path: Path | str, problem: str | None = None) -> None:
        # One argument is a whole message (DataLoader workers re-raise exceptions that way).
        super().__init__(str(path), problem)
        self.path, self.problem = str(path), problem

    def __str__(self) -> str:
        return self.path if self.problem is None else f"{self.path}: {self.problem}"


def some_names(names: Sequence[Any], limit: int = SHOWN_NAMES) -> str:
    """``a, b, c and 7 more``."""
    shown = ", ".join(str(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_class_lists(
    dataset: str, lists: dict[str, Sequence[str]], num_classes: int | None = None, why: str = ""
) -> None:
    """Every list of ``lists`` (where -> class names) names the same classes as the first one,
    and that one has ``num_classes`` of them; else an error naming the lists and the missing
    and extra classes."""
    (reference_name, reference), *others = lists.items()
    known = set(reference)
    problems = []
    if num_classes is not None and len(known) != num_classes:
        problems.append(f"data.num_classes={num_classes} but {reference_name} has {len(known)} classes")
    for where, classes in others:
        present = set(classes)
        missing = [c for c in reference if c not in present]
        extra = sorted(present - known)
        if missing:
            problems.append(f"{where} lacks {len(missing)} classes of {reference_name}: {some_names(missing)}")
        if extra:
            problems.append(f"{where} has {len(extra)} classes that {reference_name} lacks: {some_names(extra)}")
    if problems:
        raise MalformedDatasetError(
            f"{dataset}: class lists disagree:\n  " + "\n  ".join(problems) + (f"\n{why}" if why else "")
        )


@dataclass
class DataReport:
    """What a whole-dataset scan found: files checked, broken files with their problem, notes."""

    task: str
    checked: int = 0
    broken: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.broken

    def format(self) -> str:
        verdict = "ok" if self.ok else f"{len(self.broken)} broken"
        lines = [f"{self.task}: {self.checked} files checked, {verdict}"]
        lines += [f"  {note}" for note in self.notes]
        lines += [f"  BROKEN {path}: {problem}" for path, problem in self.broken]
        return "\n".join(lines)


def _problem_of(check: Callable[[T], Any], item: T) -> tuple[str, str] | None:
    try:
        check(item)
    except CorruptFileError as err:
        return err.path, err.problem or "corrupt"
    except Exception as err:  # a check that failed in an unforeseen way still names the item
        name = item[0] if isinstance(item, tuple) else item
        return str(name), f"{type(err).__name__}: {err}"
    return None


def scan_files(items: Sequence[T], check: Callable[[T], Any], workers: int = 1) -> list[tuple[str, str]]:
    """(file, problem) of every item on which ``check`` raises, checked in ``workers``
    processes (``check`` must be a module-level function or a partial of one)."""
    run = partial(_problem_of, check)
    if workers <= 1 or len(items) < 2:
        found: Iterable[tuple[str, str] | None] = map(run, items)
        return [p for p in found if p is not None]
    chunk = max(1, len(items) // (workers * 16))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return [p for p in pool.map(run, items, chunksize=chunk) if p is not None]


class CorruptSampleLog:
    """Which samples of one dataset failed to decode, shared by the DataLoader's worker
    processes (a flag per sample in shared memory), under ``data.max_corrupt_fraction``
    (see the module doc)."""

    def __init__(self, size: int, max_fraction: float, what: str) -> None:
        self.size, self.max_fraction, self.what = size, max_fraction, what
        self.allowed = math.floor(max_fraction * size)
        self.flags = multiprocessing.RawArray("b", size) if max_fraction > 0 and size else None

    def record(self, index: int, error: CorruptFileError) -> None:
        """Note sample ``index`` as corrupt; raise when the policy does not allow skipping it."""
        if self.flags is None:
            raise error
        self.flags[index] = 1
        count = self.count()
        if count > self.allowed:
            raise MalformedDatasetError(
                f"{self.what}: {count} of {self.size} files are corrupt, more than data.max_corrupt_fraction="
                f"{self.max_fraction:g} allows ({self.allowed}); the latest: {error}. "
                "`pe-bench check-data` lists every broken file."
            )

    def count(self) -> int:
        return 0 if self.flags is None else int(np.frombuffer(self.flags, dtype=np.int8).sum())


def first_readable(
    read: Callable[[int], T], index: int, count: int, log: CorruptSampleLog, key: Callable[[int], int]
) -> T:
    """``read(index)``, or, when that file is corrupt and the policy allows it, the next
    readable sample (wrapping around); ``key`` maps a position to the sample's index in ``log``."""
    for offset in range(count):
        position = (index + offset) % count
        try:
            return read(position)
        except CorruptFileError as err:
            log.record(key(position), err)
    raise MalformedDatasetError(f"{log.what}: no sample of this split could be read")


def share_seen(train: Iterable, test: Sequence) -> float:
    """The fraction of ``test``'s configurations (the generated placements or paths a label
    depends on) that are among ``train``'s: what a held-out split brings to 0."""
    seen = set(train)
    return sum(configuration in seen for configuration in test) / max(len(test), 1)


def refuse_moving_augmentations(option: str, augmentations: dict[str, bool], where: str) -> None:
    """A ConfigError when a hold-out ``option`` meets a training augmentation that moves
    positions (flips, crops, shifts, rotations, rescaling): it would carry training samples onto
    held-out configurations, while the recorded overlap, measured on the generated splits, would
    still read 0. ``augmentations``: each option's name and whether it is on."""
    on = [name for name, active in augmentations.items() if active]
    if on:
        raise ConfigError(
            f"{where}: {option} holds configurations out of training, but {', '.join(on)} "
            f"{'moves' if len(on) == 1 else 'move'} training samples' positions onto held-out ones; "
            f"turn {'it' if len(on) == 1 else 'them'} off or drop {option}"
        )


def refuse_ignored_augmentations(augmentations: dict[str, bool], source: str, where: str) -> None:
    """A ConfigError for per-sample augmentations that the generated data does not apply (they
    are transforms of the real datasets' readers), so that setting one is never a silent no-op.
    On the generated relation data a flip would change the label (a direction, a motion) anyway."""
    on = [name for name, active in augmentations.items() if active]
    if on:
        raise ConfigError(
            f"{where}: {', '.join(on)} {'augments' if len(on) == 1 else 'augment'} real datasets only; the generated "
            f"data (data.source={source}) is used as it is and would ignore {'it' if len(on) == 1 else 'them'} "
            "(a flip would also change its direction label): drop the option, or use the real dataset"
        )
