"""The grid end to end on a very small configuration: records, skips, failures, n/a, data errors."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from PIL import Image

from pe_bench.adapters import PositionEncoding, registry
from pe_bench.harness import config as pe_config
from pe_bench.harness.cli import main
from pe_bench.harness.grid import runner as pe_runner
from pe_bench.harness.grid import store

SMALL = [
    "--set", "optim.epochs=1", "--set", "data.train_size=128", "--set", "data.val_size=64",
    "--set", "data.test_size=64", "--set", "model.dim=32", "--set", "model.depth=1",
]  # fmt: skip


@pytest.fixture
def temporary_encodings():
    """Register encodings for one test and remove them afterwards."""
    added = []

    def add(name, cls):
        registry.register(name)(cls)
        added.append(name)

    yield add
    for name in added:
        registry.ENCODINGS.unregister(name)


def run(out, methods, *extra):
    return main(["run", "--tasks", "imagenet", "--methods", methods, "--out", str(out), *SMALL, *extra])


def test_grid_writes_complete_cells_and_skips_them_on_rerun(tmp_path, capsys):
    assert run(tmp_path, "nopos,rope") == 0
    cell = store.cell_dir(tmp_path, "imagenet", "rope", 0)
    record = json.loads((cell / "result.json").read_text())
    assert record["status"] == "ok" and 0 <= record["score"] <= 100 and record["profile"] == "tiny"
    for name in ("config.yaml", "env.json", "metrics.csv", "best.ckpt"):
        assert (cell / name).is_file(), name
    env = json.loads((cell / "env.json").read_text())
    assert env["packages"]["torch"] and "device" in env
    assert (tmp_path / "table.md").is_file() and "rope" in (tmp_path / "table.md").read_text()
    capsys.readouterr()
    assert run(tmp_path, "nopos,rope") == 0
    assert capsys.readouterr().out.count("finished earlier, skipped") == 2


def test_interrupted_cell_is_redone_and_its_leftovers_removed(tmp_path):
    final = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    stale = final.with_name(".seed0.partial-12345")
    stale.mkdir(parents=True)
    (stale / "metrics.csv").write_text("half-written")
    assert run(tmp_path, "nopos") == 0
    assert not stale.exists()
    assert store.read_record(final).status == "ok"


class NaNEmbedding(PositionEncoding):
    def embed(self, x, layout):
        return x * float("nan")


class BrokenLayers(PositionEncoding):
    def make_layer(self, layer_index):
        raise RuntimeError("deliberately broken")


class PointsOnly(PositionEncoding):
    pos_dims = frozenset({3})


def test_failed_diverged_and_na_cells_are_recorded_and_the_grid_goes_on(tmp_path, temporary_encodings, capsys):
    temporary_encodings("test-nan", NaNEmbedding)
    temporary_encodings("test-broken", BrokenLayers)
    temporary_encodings("test-points", PointsOnly)
    assert run(tmp_path, "test-nan,test-broken,test-points,nopos") == 1
    status = {m: store.read_record(store.cell_dir(tmp_path, "imagenet", m, 0)) for m in ("test-nan", "test-broken")}
    assert status["test-nan"].status == "diverged" and "non-finite" in status["test-nan"].reason
    assert status["test-broken"].status == "failed" and "deliberately broken" in status["test-broken"].reason
    na = store.read_record(store.cell_dir(tmp_path, "imagenet", "test-points", 0))
    assert na.status == "n/a" and "3-D" in na.reason
    assert store.read_record(store.cell_dir(tmp_path, "imagenet", "nopos", 0)).status == "ok"
    table = (tmp_path / "table.md").read_text()
    assert "n/a" in table and "failed" in table
    assert "retrying" not in capsys.readouterr().out


def test_a_non_finite_test_score_is_a_divergence_not_a_result():
    """Training's guard watches the loss only: a test metric that came out NaN (a 16-bit
    evaluation that overflowed) must not be stored as the cell's score."""
    from types import SimpleNamespace

    from pe_bench.harness.module import DivergedError

    task = SimpleNamespace(metric="acc")
    fitted = {"best_val": 0.5, "best_epoch": 1, "train_seconds": 1.0}
    parts = (torch.nn.Linear(2, 2), object(), object())
    with pytest.raises(DivergedError, match=r"non-finite test/acc \(nan\)"):
        pe_runner._cell_result(task, *parts, [{"test/acc": float("nan")}], fitted)
    assert pe_runner._cell_result(task, *parts, [{"test/acc": 0.25}], fitted)["test"] == 0.25


def test_missing_dataset_fails_fast_naming_path_and_layout(tmp_path, capsys):
    code = main(["run", "--tasks", "imagenet", "--methods", "rope", "--profile", "paper",
                 "--data-root", str(tmp_path), "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert str(tmp_path / "imagenet" / "train") in err and "<wnid>" in err and "image-net.org" in err
    assert not (tmp_path / "out" / "runs").exists()


def test_unknown_method_and_task_errors(capsys):
    assert main(["run", "--tasks", "imagenet", "--methods", "ropee"]) == 2
    assert "Did you mean 'rope'" in capsys.readouterr().err
    assert main(["run", "--tasks", "imagenett", "--methods", "rope"]) == 2
    assert "Did you mean 'imagenet'" in capsys.readouterr().err


def test_group_all_selects_every_task_and_lists_unimplemented_ones(tmp_path, capsys, monkeypatch):
    from pe_bench import tasks
    from pe_bench.tasks import groups, implemented, resolve_tasks

    messages = []
    selected = resolve_tasks("all", messages.append)
    assert selected == list(dict.fromkeys(groups()["all"])) and not messages  # nothing is skipped any more
    assert set(selected) <= set(implemented())
    # A group naming a task without an implementation skips it with a message.
    monkeypatch.setattr(tasks.base, "groups", lambda: {"all": ["imagenet", "future-task"]})
    assert resolve_tasks("all", messages.append) == ["imagenet"] and "future-task" in messages[0]


def _write_imagefolder(root, classes=("cat", "dog"), per_class=6):
    gen = torch.Generator().manual_seed(0)
    for split, count in (("train", per_class), ("val", 2)):
        for cls in classes:
            folder = root / "imagenet" / split / cls
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = (torch.rand(40, 48, 3, generator=gen) * 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"{i}.JPEG")


def test_paper_imagefolder_loader_with_stratified_split(tmp_path):
    from pe_bench.harness.config import load_run_config, parse_overrides
    from pe_bench.tasks import get_task

    _write_imagefolder(tmp_path)
    overrides = parse_overrides(["data.image_size=32", "optim.batch_size=4", "data.val_fraction=0.2",
                                 "trainer.num_workers=0", "data.num_classes=2"])  # fmt: skip
    task = get_task("imagenet")(load_run_config("imagenet", "paper", overrides), tmp_path)
    task.check_data()
    data = task.datamodule(seed=0)
    data.setup()
    assert len(data.splits["val"]) == 2 and len(data.splits["train"]) == 10  # 1 of 6 per class held out
    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    test_images, _ = next(iter(data.test_dataloader()))
    assert test_images.shape[-2:] == (32, 32) and len(data.splits["test"]) == 4
    mix = task.lightning_module(torch.nn.Identity()).batch_transform  # MixUp or CutMix
    mixed_images, soft = mix(images, labels)
    assert mixed_images.shape == images.shape and soft.shape == (4, 2)
    torch.testing.assert_close(soft.sum(-1), torch.ones(4))


def test_paper_profile_trains_one_epoch_on_the_tiny_imagefolder(tmp_path):
    _write_imagefolder(tmp_path)
    code = main([
        "run", "--tasks", "imagenet", "--methods", "rope", "--profile", "paper", "--data-root", str(tmp_path),
        "--out", str(tmp_path / "out"), "--set", "data.image_size=32", "--set", "optim.batch_size=4",
        "--set", "data.val_fraction=0.2", "--set", "trainer.num_workers=0", "--set", "optim.epochs=1",
        "--set", "model.dim=32", "--set", "model.depth=1", "--set", "model.num_heads=2",
        "--set", "data.num_classes=2",
    ])  # fmt: skip
    assert code == 0
    record = store.read_record(store.cell_dir(tmp_path / "out", "imagenet", "rope", 0))
    assert record.status == "ok" and record.profile == "paper"


def test_finished_cells_of_another_configuration_are_not_reused(tmp_path, capsys):
    from pe_bench.harness.grid.runner import stored_config_differences

    assert run(tmp_path, "nopos") == 0
    capsys.readouterr()
    # a study or override that changes what the cell measures must not be answered by the old cell
    assert run(tmp_path, "nopos", "--set", "data.tta_delta=4") == 2
    err = capsys.readouterr().err
    assert "another configuration" in err and "data.tta_delta: absent stored, 4 requested" in err
    assert run(tmp_path, "nopos", "--set", "trainer.num_workers=0") == 0  # the profile's value: no change
    # how "auto" resolved on this CPU; the request (not run yet) has no such section: reused
    config = yaml.safe_load((store.cell_dir(tmp_path, "imagenet", "nopos", 0) / "config.yaml").read_text())
    assert config["trainer"]["precision"] == "auto" and config["trainer"]["compile"] == "auto"
    assert config["trainer"]["attention_kernel"] == "auto"
    on_cpu = {"precision": "32-true", "compile": False, "attention_kernel": "dense", "world_size": 1}
    env = json.loads((store.cell_dir(tmp_path, "imagenet", "nopos", 0) / "env.json").read_text())
    assert config["effective"] == on_cpu | {"threads": env["torch_threads"]}  # the count it trained with
    threads = torch.get_num_threads()
    wanted = 2 if threads == 1 else 1  # differs from the current setting, so the check can fail
    assert run(tmp_path, "rope", "--set", f"trainer.threads={wanted}") == 0
    env = json.loads((store.cell_dir(tmp_path, "imagenet", "rope", 0) / "env.json").read_text())
    assert env["torch_threads"] == wanted
    assert env["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()  # a record's bits hold only there
    assert torch.get_num_threads() == threads  # restored after the cell
    stored = {"task": "imagenet", "model": {"dim": 32}, "data": {"a": 1}}
    # A field added since the cell ran counts only away from its default (the old behaviour).
    assert stored_config_differences(stored, {**stored, "model": {"dim": 32, "dropout": 0.0}}) == []
    effective = {"precision": "bf16-mixed", "compile": True, "world_size": 8}
    assert stored_config_differences({**stored, "effective": effective}, stored) == []
    assert stored_config_differences(
        stored, {**stored, "model": {"dim": 64, "dropout": 0.1}, "data": {"a": 1, "b": 2}}
    ) == [
        "data.b: absent stored, 2 requested",
        "model.dim: 32 stored, 64 requested",
        "model.dropout: absent stored, 0.1 requested",
    ]


def test_a_retired_key_at_its_no_change_value_is_no_difference():
    """Cells stored before optim.positional_lr_scale was replaced by table_lr_scale stay
    usable at 1.0 (it scaled nothing); at another value they differ, in both checks."""
    from pe_bench.harness.grid.runner import stored_config_differences
    from pe_bench.harness.reports import tables

    requested = {"optim": {"lr": 0.002, "table_lr_scale": 1.0}}
    assert stored_config_differences({"optim": {"lr": 0.002, "positional_lr_scale": 1.0}}, requested) == []
    assert stored_config_differences({"optim": {"lr": 0.002, "positional_lr_scale": 30.0}}, requested) == [
        "optim.positional_lr_scale: 30.0 stored, absent requested"
    ]
    tree = {"optim": {"lr": 0.002, "table_lr_scale": 1.0}}
    assert tables.config_differences("imagenet", {"optim": {"lr": 0.002, "positional_lr_scale": 1.0}}, tree) == []
    assert tables.config_differences("imagenet", {"optim": {"lr": 0.002, "positional_lr_scale": 30.0}}, tree) == [
        "optim.positional_lr_scale=30.0 (others: absent)"
    ]


ORIGINAL_TASK_YAML = pe_config.task_yaml
ORIGINAL_TRAIN_INTO = pe_runner._train_into


def _grid_with_yaml_edited_after_the_first_cell(out, monkeypatch):
    """Run nopos then sincos; once the first cell has trained, the imagenet YAML "changes"
    (its tiny profile's mlp_ratio becomes 1.0). Returns each cell's stored mlp_ratio."""
    read_yaml, train_into, edited = ORIGINAL_TASK_YAML, ORIGINAL_TRAIN_INTO, []

    def task_yaml(task):
        spec = read_yaml(task)
        if edited:
            spec["profiles"]["tiny"]["model"]["mlp_ratio"] = 1.0
        return spec

    def train_then_edit(*args, **kwargs):
        record = train_into(*args, **kwargs)
        edited.append(True)
        return record

    monkeypatch.setattr(pe_config, "task_yaml", task_yaml)
    monkeypatch.setattr(pe_runner, "_train_into", train_then_edit)
    assert run(out, "nopos,sincos") == 0
    stored = {m: store.read_cell(store.cell_dir(out, "imagenet", m, 0)).config for m in ("nopos", "sincos")}
    return {m: config["model"]["mlp_ratio"] for m, config in stored.items()}


def test_a_task_yaml_edited_while_the_grid_runs_does_not_reach_its_later_cells(tmp_path, monkeypatch):
    """A grid reads each task's YAML profile once, when it starts: a later edit must not give the
    cells that start after it another configuration (a mixed column that looks like one)."""
    pinned = _grid_with_yaml_edited_after_the_first_cell(tmp_path / "pinned", monkeypatch)
    assert pinned == {"nopos": 2.0, "sincos": 2.0}
    # The check can fail: without pinning, the second cell reads the edited file.
    from pe_bench.harness.grid.runner import GridRequest

    monkeypatch.setattr(GridRequest, "pin_profiles", lambda self: None)
    unpinned = _grid_with_yaml_edited_after_the_first_cell(tmp_path / "unpinned", monkeypatch)
    assert unpinned == {"nopos": 2.0, "sincos": 1.0}


def test_cells_run_in_workers_get_the_profiles_the_grid_pinned(monkeypatch):
    """--jobs, Ray and SLURM workers rebuild the request from its JSON payload: the pinned
    profiles travel with it, so a worker never reads the task YAML itself."""
    from pe_bench.harness.grid import executor
    from pe_bench.harness.grid.methods import parse_method
    from pe_bench.harness.grid.runner import GridRequest

    request = GridRequest(["imagenet"], [parse_method("nopos")])
    request.pin_profiles()
    request.profile_sections["imagenet"]["optim"]["epochs"] = 7  # stands for the YAML as it read at the start
    payload = json.loads(json.dumps(executor.request_payload(request)))
    seen = {}
    monkeypatch.setattr("pe_bench.harness.grid.runner.claim_and_run", lambda req, *a, **k: seen.setdefault("r", req))
    executor.run_cell_entry(payload, ("imagenet", "nopos", 0), threads=1)
    worker = seen["r"].run_config("imagenet")
    assert worker.optim.epochs == 7 and worker.trainer.threads == 1
