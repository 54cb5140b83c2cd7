"""Experiment trackers (``trainer.logger``): TensorBoard event files, W&B offline runs named
task/method/seedN and grouped by grid, and a clear error when a tracker is not installed."""

from __future__ import annotations

import importlib.util

import pytest

from pe_bench.harness.cli import main
from pe_bench.harness.grid import loggers, store

SMALL = [
    "--set", "optim.epochs=2", "--set", "data.train_size=64", "--set", "data.val_size=32",
    "--set", "data.test_size=32", "--set", "model.dim=32", "--set", "model.depth=1",
]  # fmt: skip


def run(out, methods, trackers):
    return main(["run", "--tasks", "imagenet", "--methods", methods, "--out", str(out), *SMALL,
                 "--set", f"trainer.logger=[{trackers}]"])  # fmt: skip


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs the tracking extra (tensorboard)")
def test_tensorboard_event_files_hold_the_epoch_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert run(tmp_path, "nopos", "csv,tensorboard") == 0
    cell = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    assert (cell / "metrics.csv").is_file()  # always written, trackers or not
    scalars: dict[str, list[float]] = {}
    for events in sorted((cell / "tensorboard").glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend(e.value for e in accumulator.Scalars(tag))
    assert len(scalars["train/loss"]) == 2 and len(scalars["val/acc"]) == 2  # one per epoch
    assert scalars["test/acc"][0] == pytest.approx(store.read_record(cell).score / 100)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs the tracking extra (wandb)")
def test_wandb_runs_offline_one_per_cell_named_and_grouped(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")  # also restores what Lightning sets it to
    monkeypatch.setenv("WANDB_SILENT", "true")
    started = []
    real_init = wandb.init

    def init(**kwargs):
        started.append(kwargs)
        return real_init(**kwargs)

    monkeypatch.setattr(wandb, "init", init)
    out = tmp_path / "my-grid"
    assert run(out, "nopos,rope", "wandb") == 0
    assert [(s["name"], s["group"], s["project"]) for s in started] == [
        ("imagenet/nopos/seed0", "my-grid", "pe-bench"),
        ("imagenet/rope/seed0", "my-grid", "pe-bench"),
    ]
    for method in ("nopos", "rope"):
        runs = list((store.cell_dir(out, "imagenet", method, 0) / "wandb").glob("offline-run-*/run-*.wandb"))
        assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert wandb.run is None  # each cell's run was finished


def test_a_missing_tracker_fails_before_training_and_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(loggers.PACKAGES, "mlflow", ("pe_bench_no_such_package",))
    assert run(tmp_path, "nopos", "csv,mlflow") == 2
    err = capsys.readouterr().err
    assert "mlflow needs the 'tracking' extra: pip install 'pe-bench[tracking]'" in err
    assert "(or pip install pe_bench_no_such_package)" in err
    assert not (tmp_path / "runs").exists()


def test_unknown_tracker_is_a_config_error(tmp_path, capsys):
    assert run(tmp_path, "nopos", "neptune") == 2
    assert "trainer.logger.0" in capsys.readouterr().err


@pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None or importlib.util.find_spec("sqlalchemy") is None,
    reason="needs the tracking extra (mlflow)",
)
def test_mlflow_runs_in_a_local_store_of_the_grid(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "my-grid"
    assert run(out, "nopos", "mlflow") == 0
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("my-grid")
    (only,) = client.search_runs([experiment.experiment_id])
    assert only.info.run_name == "imagenet/nopos/seed0" and only.info.status == "FINISHED"
    assert len(client.get_metric_history(only.info.run_id, "val/acc")) == 2
    record = store.read_record(store.cell_dir(out, "imagenet", "nopos", 0))
    assert only.data.metrics["test/acc"] == pytest.approx(record.score / 100)
