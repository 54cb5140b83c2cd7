"""The img/s table times every encoding's calls in alternation with nopos's
(``harness/reports/paired.py``), so that a machine drifting during a long table does not
enter the ratios. Checked with a fake clock whose calls slow down as the run goes on: no
real time is measured, so nothing here depends on the machine's noise."""

from __future__ import annotations

import pytest

from pe_bench.harness.reports import bench, paired, throughput
from pe_bench.harness.reports.bench import BenchSpec
from pe_bench.harness.reports.paired import PairedTiming, paired_timing
from pe_bench.harness.reports.throughput import throughput_table


class DriftingClock:
    """Stands in for ``paired.time_call``: runs the job and returns a duration that grows by
    ``drift`` per call (a machine slowing down) times the job's own cost; ``timed`` lists
    what each timed call ran (the job's return value when it names itself)."""

    def __init__(self, drift: float) -> None:
        self.drift, self.calls, self.timed = drift, 0, []

    def __call__(self, job, threads) -> float:
        cost = job()
        self.calls += 1
        self.timed.append(cost)
        return (1.0 + self.drift * self.calls) * cost


def test_each_call_of_the_job_follows_one_of_the_reference():
    order = []
    timing = paired_timing(lambda: order.append("job"), lambda: order.append("ref"), repeats=3, threads=1)
    assert order == ["ref", "job"] * 3
    assert len(timing.seconds) == len(timing.reference_seconds) == 3
    alone = paired_timing(lambda: order.append("alone"), None, repeats=2, threads=1)
    assert alone.reference_seconds == [] and alone.slowdown is None and alone.slowdown_iqr is None


def test_the_paired_ratio_cancels_drift_that_a_sequential_ratio_takes_in(monkeypatch):
    clock = DriftingClock(drift=0.05)
    monkeypatch.setattr(paired, "time_call", clock)
    nopos, method = (lambda: 1.0), (lambda: 1.5)  # the method truly costs 1.5x
    first = paired_timing(nopos, None, repeats=5)  # nopos measured first, as the table does
    later = paired_timing(method, nopos, repeats=5)
    assert later.slowdown == pytest.approx(1.5, rel=0.04)  # off by one call's drift at most
    assert later.median_seconds / first.median_seconds > 1.5 * 1.3  # what a sequential table reports


def test_slowdown_is_the_median_of_pair_ratios_and_iqr_their_spread():
    timing = PairedTiming(seconds=[2.0, 3.0, 6.0, 4.0], reference_seconds=[1.0, 1.0, 2.0, 1.0])
    assert timing.ratios == [2.0, 3.0, 3.0, 4.0]
    assert timing.slowdown == 3.0
    assert timing.slowdown_iqr == pytest.approx(3.25 - 2.75)
    assert PairedTiming(seconds=[2.0], reference_seconds=[1.0]).slowdown_iqr == 0.0


def test_the_img_s_table_pairs_every_timed_call_with_nopos(monkeypatch):
    """The table keeps nopos's jobs and calls one before each of another method's timed
    calls; the ratio it reports is the paired one, and nopos's img/s over the whole run
    shows the drift."""
    clock = DriftingClock(drift=0.05)
    monkeypatch.setattr(paired, "time_call", clock)
    models: list[int] = []  # first model seen: nopos, second: rope
    ran: list[str] = []

    def cost(model) -> float:
        if id(model) not in models:
            models.append(id(model))
        ran.append(["nopos", "rope"][models.index(id(model))])
        return [1.0, 1.5][models.index(id(model))]

    monkeypatch.setattr(throughput, "_inference", lambda model, images, device: cost(model))
    monkeypatch.setattr(bench._TrainStep, "__call__", lambda self: cost(self.model))
    spec = BenchSpec(model="tiny", methods=("rope",), batches=(2,), repeats=4)
    table = throughput_table(spec)
    for column in ("train_img_s_b2", "infer_img_s_b2"):
        assert table.loc["rope", f"{column}_vs_nopos"] == pytest.approx(1.5, rel=0.04)
        assert table.loc["rope", f"{column}_vs_nopos_iqr"] >= 0
        assert table.loc["nopos", f"{column}_vs_nopos"] == 1.0
        # a sequential ratio of the two medians would have taken in the drift
        assert table.loc["nopos", column] / table.loc["rope", column] > 1.5 * 1.2
        run = table.attrs["nopos_over_the_run"][column]
        assert run["calls"] == 8 and run["p10"] < run["median"] < run["p90"]
    # nopos's own timed calls (train, infer), then each of rope's right after one of nopos's
    per_column = 2 * spec.repeats
    assert clock.timed[:per_column] == [1.0] * per_column
    assert clock.timed[per_column:] == [1.0, 1.5] * per_column


def test_bench_prints_how_steady_nopos_was_over_the_run(capsys):
    from pe_bench.harness.cli import main

    args = ["bench", "--model", "tiny", "--methods", "nopos,rope", "--repeats", "2", "--no-forward"]
    assert main([*args, "--throughput", "--throughput-batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "nopos over the whole run, train_img_s_b1: median" in out and "(4 timed calls)" in out
    assert "infer_img_s_b1_vs_nopos_iqr" in out
