"""A DDP cell is one cell: two CPU (gloo) ranks through the real CLI train one cell, the grid
runs once, and the record counts every validation and test sample exactly once."""

from __future__ import annotations

import csv
import json
import subprocess
from dataclasses import fields
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from tiny_grid import cli_command

from pe_bench.harness.config import ConfigError, TrainerConfig, load_run_config
from pe_bench.harness.data import WholeSplit
from pe_bench.harness.grid import store
from pe_bench.harness.grid.ddp import launches_ranks
from pe_bench.harness.grid.methods import parse_method
from pe_bench.tasks import get_task

# 33 validation and test samples: split over 2 ranks, a padded DistributedSampler would
# repeat one, and an accuracy over 34 samples never equals one over 33 (unless 0 or 100 %).
SETTINGS = {
    "optim": {"epochs": 1},
    "data": {"train_size": 64, "val_size": 33, "test_size": 33},
    "model": {"dim": 32, "depth": 1},
}
DDP = ["trainer.accelerator=cpu", "trainer.strategy=ddp", "trainer.devices=2", "trainer.threads=1"]


def set_args() -> list[str]:
    pairs = [f"{section}.{key}={value}" for section, values in SETTINGS.items() for key, value in values.items()]
    return [arg for pair in pairs + DDP for arg in ("--set", pair)]


class CountTestSamples(L.Callback):
    def __init__(self) -> None:
        self.samples = 0

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.samples += len(batch[1])


def evaluate_alone(checkpoint: Path) -> tuple[float, float]:
    """(val acc, test acc) of ``checkpoint`` on the full splits, in this one process."""
    config = load_run_config("imagenet", "tiny", SETTINGS)
    task = get_task("imagenet")(config, None)
    method = parse_method("pape")
    L.seed_everything(0, verbose=False)
    module = task.lightning_module(task.build_model(method.encoding(config.methods.get(method.name))))
    counter = CountTestSamples()
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, callbacks=[counter])
    data = task.datamodule(0)
    val = trainer.validate(module, datamodule=data, ckpt_path=str(checkpoint), verbose=False)[0]["val/acc"]
    test = trainer.test(module, datamodule=data, ckpt_path=str(checkpoint), verbose=False)[0]["test/acc"]
    assert counter.samples == 33  # the reference itself saw every test sample once
    return float(val), float(test)


@pytest.mark.slow
def test_a_two_rank_cell_runs_once_and_counts_every_sample_once(tmp_path):
    out = tmp_path / "results"
    command = cli_command("run", "--tasks", "imagenet", "--methods", "pape", "--out", str(out), *set_args())
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The grid ran in one process: one cell line, one table (the ranks only fit the cell).
    assert done.stdout.count("[1/1] imagenet · pape · seed 0: Acc. (%)") == 1, done.stdout
    assert done.stdout.count("| Position encoding") == 1, done.stdout

    cell = store.cell_dir(out, "imagenet", "pape", 0)
    files = ["best.ckpt", "config.yaml", "env.json", "metrics.csv", "result.json"]
    assert sorted(p.name for p in cell.iterdir()) == files  # as a one-process cell's
    assert [p.name for p in cell.parent.iterdir()] == ["seed0"]  # no staging or lock left behind
    record = json.loads((cell / "result.json").read_text())
    assert sorted(record) == sorted(f.name for f in fields(store.CellRecord))  # what the store writes for any cell
    assert record["status"] == "ok" and record["best_epoch"] == 1
    # how the cell ran, for the tables' check: two ranks (twice the global batch of one)
    assert yaml.safe_load((cell / "config.yaml").read_text())["effective"]["world_size"] == 2
    with (cell / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["epoch"] for row in rows] == ["1"]

    val, test = evaluate_alone(cell / "best.ckpt")
    assert 0.0 < test < 1.0 and 0.0 < val < 1.0  # else a padded count could coincide
    assert record["score"] == pytest.approx(100 * test, abs=1e-4)
    assert record["best_val"] == pytest.approx(100 * val, abs=1e-4)
    assert float(rows[0]["val/acc"]) == pytest.approx(val, abs=1e-6)


def test_whole_split_sampler_reads_every_sample_once_in_order():
    assert list(WholeSplit(range(7))) == list(range(7))


def test_ranks_are_launched_for_several_local_devices_only():
    assert not launches_ranks(TrainerConfig(accelerator="cpu", devices=1))
    assert launches_ranks(TrainerConfig(accelerator="cpu", devices=2, strategy="ddp"))
    with pytest.raises(ConfigError, match="num_nodes"):
        launches_ranks(TrainerConfig(accelerator="cpu", devices=2, strategy="ddp", num_nodes=2))


def test_torch_metrics_are_local_in_a_rank():
    from torchmetrics.classification import MulticlassAccuracy

    from pe_bench.harness.grid.ddp import local_metrics

    module = torch.nn.Module()
    module.acc = MulticlassAccuracy(3)
    local_metrics(module)
    assert module.acc.distributed_available_fn() is False
