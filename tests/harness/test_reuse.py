"""Which settings let a finished cell be reused: every one that can change its result counts."""

from __future__ import annotations

import pytest

from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.harness.config_diff import RESULT_NEUTRAL_KEYS
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.grid.runner import resolved_config
from pe_bench.harness.grid.runner import stored_config_differences as config_differences

SMALL = [
    "--set", "optim.epochs=1", "--set", "data.train_size=64", "--set", "data.val_size=32",
    "--set", "data.test_size=32", "--set", "model.dim=32", "--set", "model.depth=1",
]  # fmt: skip


def _stored(**trainer):
    config = load_run_config("imagenet", "tiny", {"trainer": trainer})
    return resolved_config(config, parse_method("rope"), {})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("precision", "bf16-mixed"),
        ("threads", 3),
        ("max_time", "00:00:05:00"),
        ("devices", 2),
        ("num_nodes", 2),
        ("strategy", "ddp"),
        ("accelerator", "gpu"),
        ("num_workers", 4),  # workers draw the random augmentations from their own streams
    ],
)
def test_trainer_settings_that_change_results_prevent_reuse(key, value):
    assert config_differences(_stored(), _stored(**{key: value})) == [
        f"trainer.{key}: {_stored()['trainer'][key]!r} stored, {value!r} requested"
    ]


def test_settings_that_cannot_change_results_are_ignored():
    assert {"trainer.logger"} == RESULT_NEUTRAL_KEYS  # num_workers counts: see the test above
    assert config_differences(_stored(), _stored(logger=["csv", "tensorboard"])) == []
    other = _stored()
    other["methods"] = {"cape": {"freq_scale": 1.0}}  # another method's options
    assert config_differences(_stored(), other) == []
    older = _stored()
    del older["trainer"]["logger"]  # a cell stored before the field existed, at its default
    assert config_differences(older, _stored()) == []


def test_grid_refuses_a_cell_trained_under_another_time_cap(tmp_path, capsys):
    run = ["run", "--tasks", "imagenet", "--methods", "nopos", "--out", str(tmp_path), *SMALL]
    assert main(run) == 0
    capsys.readouterr()
    assert main([*run, "--set", "trainer.max_time=00:00:10:00"]) == 2
    assert "trainer.max_time: None stored, '00:00:10:00' requested" in capsys.readouterr().err
