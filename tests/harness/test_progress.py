"""A cell's per-epoch log (metrics.csv, best epoch, printed lines) and the grid's ETA line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pe_bench.harness.cli import main
from pe_bench.harness.grid import store
from pe_bench.harness.grid.progress import format_duration, grid_progress

SMALL = [
    "--set", "optim.epochs=3", "--set", "data.train_size=128", "--set", "data.val_size=64",
    "--set", "data.test_size=64", "--set", "model.dim=32", "--set", "model.depth=1",
]  # fmt: skip


def test_one_row_per_epoch_best_epoch_recorded_and_epoch_lines_printed(tmp_path, capsys):
    code = main(["run", "--tasks", "imagenet", "--methods", "rope", "--out", str(tmp_path), "--no-progress", *SMALL])
    assert code == 0
    cell = store.cell_dir(tmp_path, "imagenet", "rope", 0)
    metrics = pd.read_csv(cell / "metrics.csv")
    assert list(metrics.columns) == ["epoch", "train/loss", "val/acc", "lr", "seconds"]
    assert metrics["epoch"].tolist() == [1, 2, 3]
    assert metrics.notna().all().all()  # training and validation of an epoch share its row
    assert (metrics["seconds"] > 0).all() and (metrics["lr"] > 0).all()
    record = json.loads((cell / "result.json").read_text())
    # ModelCheckpoint keeps the first epoch reaching the best validation value
    assert record["best_epoch"] == int(metrics["epoch"][metrics["val/acc"].idxmax()])
    assert record["best_val"] == pytest.approx(100 * metrics["val/acc"].max())
    out = capsys.readouterr().out
    for epoch in (1, 2, 3):
        assert f"epoch {epoch}/3: loss " in out
    assert "val Acc. (%)" in out


def test_grid_progress_line():
    assert grid_progress(0, 4, 0.0) == "0/4 cells done, 4 left, 0s elapsed"
    assert grid_progress(1, 4, 90.0) == "1/4 cells done, 3 left, 1m30s elapsed, ETA 4m30s"
    assert grid_progress(4, 4, 7300.0) == "4/4 cells done, 0 left, 2h01m elapsed"
    with pytest.raises(ValueError, match="done <= total"):
        grid_progress(5, 4, 1.0)


def test_format_duration():
    assert [format_duration(s) for s in (0.4, 59, 60, 3599, 3600, 90061)] == ["0s", "59s", "1m00s", "59m59s",
                                                                               "1h00m", "25h01m"]  # fmt: skip
