"""Time a job against a reference job call by call, in alternation.

The img/s table measures one encoding after another (a GPU holds one ViT-B training setup
at a time comfortably, not sixteen). Timed one after another, each encoding is compared with
a nopos measured minutes earlier, so whatever the machine does in between (clocks, other
load, a warming allocator) enters the ratio, and nothing shows it: on this 2-core CPU,
nopos's own img/s moved 1.8x between the start and the end of a 7-measurement run of the
tiny model. Alternating one call of the reference with one call of the job and taking the
median of the per-pair ratios cancels drift that is slow against a pair, and the spread
of those ratios says how far a ratio can be trusted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def time_call(job: Callable[[], object], threads: int) -> float:
    """Seconds of exactly one call of ``job`` with ``threads`` CPU threads, CUDA synchronised
    before and after. (``torch.utils.benchmark.Timer.timeit`` would call the job twice more
    first, as its own warm-up: three calls per sample, the reference's no longer right
    before the job's.)"""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _synchronise()
        start = time.perf_counter()
        job()
        _synchronise()
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)


def _synchronise() -> None:
    if torch.cuda.is_initialized():  # nothing to wait for on a CUDA that no one started
        torch.cuda.synchronize()


@dataclass
class PairedTiming:
    """Timed calls of a job, each after one call of the reference (when there is one)."""

    seconds: list[float]
    #: the reference's call before each of the job's, same index; empty without a reference
    reference_seconds: list[float] = field(default_factory=list)

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def ratios(self) -> list[float]:
        """The job's time over the reference's, pair by pair (none without a reference)."""
        if not self.reference_seconds:
            return []
        return [t / r for t, r in zip(self.seconds, self.reference_seconds, strict=True)]

    @property
    def slowdown(self) -> float | None:
        """Median over the pairs of job time / reference time: how many times slower than
        the reference (reference img/s over the job's); None without a reference."""
        return statistics.median(self.ratios) if self.reference_seconds else None

    @property
    def slowdown_iqr(self) -> float | None:
        """Interquartile range of the per-pair ratios (0 for fewer than 2 pairs)."""
        ratios = self.ratios
        if len(ratios) < 2:
            return None if not ratios else 0.0
        low, _, high = statistics.quantiles(ratios, n=4, method="inclusive")
        return high - low


def paired_timing(
    job: Callable[[], object], reference: Callable[[], object] | None, repeats: int, threads: int | None = None
) -> PairedTiming:
    """``repeats`` timed calls of ``job``, each right after a timed call of ``reference``
    (both already warmed up); without a reference, ``repeats`` calls of ``job`` alone."""
    threads = threads or torch.get_num_threads()
    timing = PairedTiming(seconds=[])
    for _ in range(repeats):
        if reference is not None:
            timing.reference_seconds.append(time_call(reference, threads))
        timing.seconds.append(time_call(job, threads))
    return timing
