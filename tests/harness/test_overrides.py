"""Config overrides per task: ``--set TASK:KEY=VALUE`` and ``-c FILE``, and which one wins."""

from __future__ import annotations

import pytest
import yaml

from pe_bench.harness.cli import main
from pe_bench.harness.config import ConfigError, load_override_file, parse_overrides, task_overrides
from pe_bench.harness.grid import store
from pe_bench.harness.grid.runner import GridRequest


def test_set_pairs_scoped_to_a_task_or_to_all():
    scoped = task_overrides(["optim.epochs=2", "imagenet:optim.lr=1e-3", "imagenet:trainer.max_time=00:01:00:00"])
    assert scoped == {
        "all": {"optim": {"epochs": 2}},
        "imagenet": {"optim": {"lr": "1e-3"}, "trainer": {"max_time": "00:01:00:00"}},  # ':' in a value stays
    }
    assert parse_overrides(["model.dim=32"]) == {"model": {"dim": 32}}
    with pytest.raises(ConfigError, match="imagenet:KEY=VALUE"):
        parse_overrides(["imagenet:model.dim=32"])
    with pytest.raises(ConfigError, match="TASK:KEY=VALUE"):
        task_overrides([":model.dim=32"])
    with pytest.raises(ConfigError, match="KEY=VALUE or TASK:KEY=VALUE"):
        task_overrides(["imagenet:model.dim"])


def test_override_file_nested_and_dotted_keys_and_command_line_wins(tmp_path):
    path = tmp_path / "overrides.yaml"
    path.write_text(
        "all:\n  optim: {epochs: 5}\n"
        "imagenet:\n  optim: {lr: 1.0e-3}\n  data.image_size: 32\n  optim.batch_size: 16\n"
    )
    assert load_override_file(path) == {
        "all": {"optim": {"epochs": 5}},
        "imagenet": {"optim": {"lr": 0.001, "batch_size": 16}, "data": {"image_size": 32}},
    }
    scoped = task_overrides(["optim.epochs=7", "imagenet:optim.lr=0.5"], [path])
    assert scoped["all"] == {"optim": {"epochs": 7}}
    assert scoped["imagenet"]["optim"] == {"lr": 0.5, "batch_size": 16}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- optim.lr: 1\n", "expected a mapping of task names"),
        ("imagenet: 3\n", "'imagenet' must map to config keys"),
        ("imagenet: {optim: [\n", "not valid YAML"),
    ],
)
def test_bad_override_files_are_named(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_override_file(path)
    assert str(path) in str(err.value)
    with pytest.raises(ConfigError, match="no such file"):
        load_override_file(tmp_path / "missing.yaml")


def test_a_tasks_own_overrides_beat_the_grid_wide_ones():
    request = GridRequest(
        ["imagenet", "modelnet40"], [], overrides={"optim": {"epochs": 2, "lr": 0.1}},
        task_overrides={"imagenet": {"optim": {"lr": 0.5}}},
    )  # fmt: skip
    assert request.overrides_for("imagenet") == {"optim": {"epochs": 2, "lr": 0.5}}
    assert request.overrides_for("modelnet40") == {"optim": {"epochs": 2, "lr": 0.1}}


def test_run_applies_file_and_task_scoped_overrides(tmp_path, capsys):
    path = tmp_path / "small.yaml"
    small = {"optim": {"epochs": 1}, "data": {"train_size": 64, "val_size": 32, "test_size": 32}}
    path.write_text(yaml.safe_dump({"all": small, "imagenet": {"model": {"dim": 32, "depth": 1}}}))
    out = tmp_path / "out"
    base = ["run", "--tasks", "imagenet", "--methods", "nopos", "--out", str(out), "-c", str(path)]
    assert main([*base, "--set", "imagenet:optim.lr=0.002"]) == 0
    stored = yaml.safe_load((store.cell_dir(out, "imagenet", "nopos", 0) / "config.yaml").read_text())
    assert stored["model"]["dim"] == 32 and stored["optim"]["epochs"] == 1 and stored["optim"]["lr"] == 0.002
    capsys.readouterr()
    assert main([*base, "--set", "imagenett:optim.lr=0.002"]) == 2
    assert "Did you mean 'imagenet'" in capsys.readouterr().err
    assert main([*base, "--set", "modelnet40:optim.lr=0.002"]) == 2
    assert "modelnet40 is not a task of this grid (imagenet)" in capsys.readouterr().err
