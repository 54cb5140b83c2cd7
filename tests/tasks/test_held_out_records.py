"""Every hold-out option through the CLI: a short tiny cell records the share of its test samples
whose configuration training showed, measured on its splits (0.0: the hold-out works); and the
augmentations that would make that figure wrong are refused."""

from __future__ import annotations

import json

import pytest

from pe_bench.harness.cli import main
from pe_bench.harness.config import ConfigError, load_run_config, parse_overrides
from pe_bench.harness.grid import store
from pe_bench.tasks.base import get_task

SMALL = ["optim.epochs=1", "optim.batch_size=16", "model.dim=32", "model.depth=1"]


@pytest.mark.parametrize(
    ("task", "overrides", "recorded"),
    [
        ("imagenet", ["data.train_size=64", "data.val_size=16", "data.test_size=16", "data.held_out_pairs=0.25"],
         "test_placements_seen_in_training"),
        ("dvsgesture", ["data.train_size=64", "data.val_size=16", "data.test_size=16", "data.held_out_paths=0.25"],
         "test_paths_seen_in_training"),
        ("ucf101", ["data.image_height=20", "data.image_width=20", "data.train_size=64", "data.val_size=16",
                    "data.test_size=16", "data.held_out_paths=0.25"], "test_paths_seen_in_training"),
        ("coco", ["model.neck_dim=16", "data.train_size=24", "data.test_size=8", "data.val_fraction=0.25",
                  "data.held_out_marker_cells=0.25"], "test_objects_seen_in_training"),
    ],
)  # fmt: skip
def test_a_cell_records_the_share_of_seen_test_configurations(tmp_path, monkeypatch, task, overrides, recorded):
    monkeypatch.setenv("PE_BENCH_CACHE", str(tmp_path / "cache"))  # tiny COCO is written here
    argv = ["run", "--tasks", task, "--methods", "rope", "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(argv + [arg for override in SMALL + overrides for arg in ("--set", override)]) == 0
    record = json.loads((store.cell_dir(tmp_path / "out", task, "rope", 0) / "result.json").read_text())
    assert record["status"] == "ok" and record["extra"][recorded] == 0.0


@pytest.mark.parametrize(
    ("task", "overrides", "named"),
    [
        ("imagenet", ["data.held_out_pairs=0.25", "data.train_sides=[16,24]"], "data.train_sides"),
        ("dvsgesture", ["data.held_out_paths=0.25", "data.nda=true", "data.event_drop=true"], "data.nda"),
        ("coco", ["data.held_out_marker_cells=0.25", "data.large_scale_jitter=true"], "data.large_scale_jitter"),
    ],
)
def test_a_hold_out_refuses_augmentations_that_move_positions(task, overrides, named):
    """Such an augmentation carries training samples onto held-out configurations while the
    recorded overlap (measured on the generated splits) would still read 0."""
    config = load_run_config(task, "tiny", parse_overrides(overrides))
    with pytest.raises(ConfigError, match=f"{task}/tiny: data.held_out.*{named} moves training samples"):
        get_task(task)(config)
    get_task(task)(load_run_config(task, "tiny", parse_overrides(overrides[1:])))  # without the hold-out: fine


@pytest.mark.parametrize(
    ("task", "option"),
    [("imagenet", "data.hflip"), ("imagenet", "data.randaugment"), ("imagenet", "data.random_resized_crop"),
     ("cifar10", "data.hflip"), ("ucf101", "data.hflip"), ("ucf101", "data.randaugment")],
)  # fmt: skip
def test_per_sample_augmentations_the_generated_data_ignores_are_errors(task, option):
    """They transform the real datasets only: on the generated data they were a silent no-op."""
    config = load_run_config(task, "tiny", parse_overrides([f"{option}=true"]))
    with pytest.raises(ConfigError, match=f"{task}/tiny: {option} augments real datasets only"):
        get_task(task)(config)
