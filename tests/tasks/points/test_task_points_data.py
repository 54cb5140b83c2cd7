"""Point-cloud tasks: real-layout readers on tiny fixture files, missing-data errors, end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.harness.grid import store
from pe_bench.tasks import get_task
from pe_bench.tasks.points.readers import DatasetMissingError

# a backbone small enough for fixtures: two stages, one block each
SMALL_PTV3 = {"enc_depths": [1, 1], "enc_channels": [16, 32], "enc_num_head": [1, 2], "stem_kernel": 3}
SMALL_BACKBONE = {
    "model": {"dim": 16, "num_heads": 1, "patch_size": 32, "ptv3": SMALL_PTV3},
    "optim": {"batch_size": 2},
}


def write_modelnet(root, classes=("chair", "table"), per_split=2, points=64):
    root.mkdir(parents=True)
    (root / "modelnet40_shape_names.txt").write_text("\n".join(classes) + "\n")
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        names = []
        for cls in classes:
            (root / cls).mkdir(exist_ok=True)
            for k in range(per_split):
                name = f"{cls}_{k + 1 + (100 if split == 'test' else 0):04d}"
                data = np.concatenate([rng.normal(size=(points, 3)), rng.normal(size=(points, 3))], axis=1)
                np.savetxt(root / cls / f"{name}.txt", data, fmt="%.6f", delimiter=",")
                names.append(name)
        (root / f"modelnet40_{split}.txt").write_text("\n".join(names) + "\n")


def write_scannet(root, scenes=2, points=300):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for s in range(scenes):
            scene = root / split / f"scene{s:04d}_00"
            scene.mkdir(parents=True)
            coord = rng.uniform(0, 3, (points, 3)).astype(np.float32)
            np.save(scene / "coord.npy", coord)
            np.save(scene / "color.npy", rng.integers(0, 255, (points, 3)).astype(np.uint8))
            np.save(scene / "normal.npy", rng.normal(size=(points, 3)).astype(np.float32))
            segment = rng.integers(-1, 20, points).astype(np.int16)
            np.save(scene / "segment20.npy", segment)


def test_modelnet40_reader_batches_the_real_layout(tmp_path):
    write_modelnet(tmp_path / "modelnet40_normal_resampled")
    config = load_run_config(
        "modelnet40",
        "paper",
        {**SMALL_BACKBONE, "model": SMALL_BACKBONE["model"] | {"depth": 2}, "trainer": {"num_workers": 0}},
    )
    config.data.update(num_classes=2, val_fraction=0.5, num_points=50)
    task = get_task("modelnet40")(config, tmp_path)
    task.check_data()
    data = task.datamodule(0)
    data.setup()
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [2, 2, 4]
    batch = next(iter(data.test_dataloader()))
    assert batch["feat"].shape[1] == 6 and batch["label"].tolist() == [0, 0]
    assert batch["coord"].shape[0] == batch["batch"].shape[0] <= 100
    assert batch["coord"].norm(dim=1).max() <= 1.0 + 1e-5  # NormalizeCoord
    logits = task.build_model(EncodingFactory("rope"))(batch)
    assert logits.shape == (2, 2)


def test_scannet_reader_batches_the_real_layout(tmp_path):
    write_scannet(tmp_path / "scannet")
    overrides = {**SMALL_BACKBONE, "trainer": {"num_workers": 0}}
    decoder = {"dec_depths": [1], "dec_channels": [16], "dec_num_head": [1]}
    overrides["model"] = SMALL_BACKBONE["model"] | {"depth": 3, "ptv3": SMALL_PTV3 | decoder}
    task = get_task("scannet")(load_run_config("scannet", "paper", overrides), tmp_path)
    task.check_data()
    data = task.datamodule(0)
    data.setup()
    batch = next(iter(data.val_dataloader()))
    assert batch["feat"].shape[1] == 6 and batch["feat"][:, :3].abs().max() <= 1.0  # NormalizeColor
    assert batch["segment"].shape == batch["batch"].shape and batch["segment"].min() >= -1
    assert batch["coord"][:, 2].min() >= -1e-6  # floor at z = 0 (CenterShift apply_z)
    train = next(iter(data.train_dataloader()))
    out = task.build_model(EncodingFactory("sincos"))(train)
    assert out.shape == (len(train["batch"]), 20)


@pytest.mark.parametrize("name", ["modelnet40", "scannet"])
def test_missing_dataset_error_names_path_and_layout(tmp_path, name):
    task = get_task(name)(load_run_config(name, "paper"), tmp_path)
    with pytest.raises(DatasetMissingError) as err:
        task.check_data()
    message = str(err.value)
    folder = "modelnet40_normal_resampled" if name == "modelnet40" else "scannet"
    assert str(tmp_path / folder) in message
    assert ("modelnet40_shape_names.txt" in message) if name == "modelnet40" else ("segment20.npy" in message)


def test_model_section_must_agree_with_the_backbone():
    from pe_bench.harness.config import ConfigError

    with pytest.raises(ConfigError, match=r"model.dim=48 but model\.ptv3 says 32"):
        get_task("modelnet40")(load_run_config("modelnet40", "tiny", {"model": {"dim": 48}}))


TINY = {
    # enough steps for OneCycleLR's warm-up and decay phases (it divides by their lengths)
    "modelnet40": ["data.train_size=32", "data.val_size=16", "data.test_size=16", "data.num_points=128"],
    "scannet": ["data.train_size=4", "data.val_size=2", "data.test_size=2", "data.room_density=15"],
}
BATCH = {"modelnet40": 4, "scannet": 1}


@pytest.mark.parametrize("name", ["modelnet40", "scannet"])
def test_one_short_cell_end_to_end(tmp_path, name):
    pairs = [*TINY[name], "optim.epochs=1", f"optim.batch_size={BATCH[name]}"]
    sets = [arg for pair in pairs for arg in ("--set", pair)]
    assert main(["run", "--tasks", name, "--methods", "pape,lookhere", "--out", str(tmp_path), *sets]) == 0
    record = json.loads((store.cell_dir(tmp_path, name, "pape", 0) / "result.json").read_text())
    assert record["status"] == "ok", record.get("reason")
    assert 0 <= record["score"] <= 100 and record["extra"]["positional_parameters"] > 0
    na = json.loads((store.cell_dir(tmp_path, name, "lookhere", 0) / "result.json").read_text())
    assert na["status"] == "n/a" and "2-D" in na["reason"]  # a 2D-grid-only encoding


def test_benchmark_hook_reports_both_sizes(monkeypatch):
    from pe_bench.tasks.points import bench

    monkeypatch.setattr(bench, "SIZES", (300, 600))
    monkeypatch.setattr(bench, "PROFILES", ("tiny",))  # the paper backbone takes long to build
    report = get_task("modelnet40").benchmark("cpu")
    assert "| 300 |" in report and "| 600 |" in report
