"""One very short tiny cell per detection task, through the CLI: train, validate, test, record."""

from __future__ import annotations

import json

import pytest
import yaml

from pe_bench.harness.cli import main
from pe_bench.harness.grid import store
from pe_bench.tasks import resolve_tasks

SMALL_MODEL = ["--set", "optim.epochs=1", "--set", "optim.batch_size=8", "--set", "model.dim=32",
               "--set", "model.depth=1", "--set", "model.neck_dim=16", "--set", "trainer.threads=1"]  # fmt: skip


@pytest.mark.parametrize(
    ("task", "data"),
    [
        ("coco", ["--set", "data.train_size=24", "--set", "data.test_size=8", "--set", "data.val_fraction=0.25"]),
        ("gen1", ["--set", "data.train_size=16", "--set", "data.val_size=8", "--set", "data.test_size=8"]),
    ],
)
def test_tiny_detection_cell_end_to_end(tmp_path, monkeypatch, task, data):
    monkeypatch.setenv("PE_BENCH_CACHE", str(tmp_path / "cache"))  # tiny COCO is written here
    out = tmp_path / "out"
    assert main(["run", "--tasks", task, "--methods", "pape", "--out", str(out), *SMALL_MODEL, *data]) == 0
    record = json.loads((store.cell_dir(out, task, "pape", 0) / "result.json").read_text())
    assert record["status"] == "ok" and record["metric"] == "map" and 0 <= record["score"] <= 100
    assert {"ap50", "ap75", "map_one_to_many_nms"} <= set(record["extra"])
    assert "mAP" in (out / "table.md").read_text()
    # the mAP's evaluation (and the generated scenes' photographs) come from these packages
    config = yaml.safe_load((store.cell_dir(out, task, "pape", 0) / "config.yaml").read_text())
    expected = {"pycocotools", "scikit-image"} if task == "coco" else {"pycocotools"}
    assert set(config["effective"]["data"]) == expected


def test_detection_tasks_are_in_the_table1_groups():
    assert {"coco", "gen1"} <= set(resolve_tasks("pape-table1", warn=lambda _: None))
    assert {"coco", "gen1"} <= set(resolve_tasks("all", warn=lambda _: None))
