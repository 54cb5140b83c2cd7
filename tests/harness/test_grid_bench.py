"""`pe-bench bench --grid`: the same tiny grid under each executor, timed, every cell finished."""

from __future__ import annotations

import math

import pytest

from pe_bench.harness.reports.grid_bench import GridBenchSpec, grid_bench

pytestmark = pytest.mark.slow

SMALL = (
    "optim.epochs=1", "data.train_size=64", "data.val_size=32", "data.test_size=32", "model.dim=32", "model.depth=1",
)  # fmt: skip


def test_grid_bench_times_one_grid_sequentially_and_with_jobs():
    lines: list[str] = []
    spec = GridBenchSpec("imagenet", "nopos,rope", "0", SMALL, jobs=2, ray=False)
    table = grid_bench(spec, say=lines.append)
    assert list(table.index) == ["--jobs 1", "--jobs 2"]
    assert table["cells"].tolist() == [2, 2]
    assert (table["wall_s"] > 0).all() and table["speedup_vs_1_job"].iloc[0] == 1.0
    assert all(math.isfinite(v) for v in table["speedup_vs_1_job"])
    assert table["max_score_diff"].iloc[0] == 0.0
    assert any("caching the tiny data" in line for line in lines)


def test_grid_bench_reports_a_grid_that_does_not_run():
    spec = GridBenchSpec("imagenet", "no-such-encoding", "0", SMALL, jobs=2, ray=False)
    with pytest.raises(RuntimeError, match="no-such-encoding"):
        grid_bench(spec, say=lambda line: None)
