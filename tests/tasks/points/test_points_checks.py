"""ModelNet40 and ScanNet on tiny fixtures in the real formats: class lists, every scene and
every shape checked, malformed files named, ``pe-bench check-data``."""

from __future__ import annotations

import numpy as np
import pytest
from test_task_points_data import SMALL_BACKBONE, write_modelnet, write_scannet

from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.harness.data import DatasetMissingError
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.data_checks import CorruptFileError, MalformedDatasetError


def modelnet(data_root, num_classes=2):
    overrides = {**SMALL_BACKBONE, "model": SMALL_BACKBONE["model"] | {"depth": 2}, "trainer": {"num_workers": 0}}
    overrides["data"] = {"num_classes": num_classes, "val_fraction": 0.5, "num_points": 50}
    return get_task("modelnet40")(load_run_config("modelnet40", "paper", overrides), data_root)


def scannet(data_root):
    return get_task("scannet")(load_run_config("scannet", "paper"), data_root)


def test_a_class_of_the_shape_names_without_test_shapes_is_named(tmp_path):
    root = tmp_path / "modelnet40_normal_resampled"
    write_modelnet(root, classes=("chair", "lamp", "table"))
    test_list = root / "modelnet40_test.txt"
    test_list.write_text("\n".join(n for n in test_list.read_text().split() if not n.startswith("lamp")) + "\n")
    with pytest.raises(MalformedDatasetError) as err:
        modelnet(tmp_path, num_classes=3).check_data()
    assert f"{test_list} lacks 1 classes of {root / 'modelnet40_shape_names.txt'}: lamp" in str(err.value)


def test_shape_names_must_count_num_classes(tmp_path):
    write_modelnet(tmp_path / "modelnet40_normal_resampled")
    with pytest.raises(MalformedDatasetError, match=r"data.num_classes=40 but .*modelnet40_shape_names.txt has 2"):
        modelnet(tmp_path, num_classes=40).check_data()


def test_a_listed_shape_file_that_is_missing_is_named_before_training(tmp_path):
    root = tmp_path / "modelnet40_normal_resampled"
    write_modelnet(root)
    (root / "table" / "table_0102.txt").unlink()
    with pytest.raises(DatasetMissingError, match=r"1 listed shape files are missing: .*table_0102.txt"):
        modelnet(tmp_path).check_data()


def test_a_malformed_shape_file_is_named_when_loaded(tmp_path):
    root = tmp_path / "modelnet40_normal_resampled"
    write_modelnet(root)
    broken = root / "chair" / "chair_0101.txt"
    lines = broken.read_text().splitlines()
    lines[3] = "0.1,0.2,abc,0,0,1"
    broken.write_text("\n".join(lines))
    data = modelnet(tmp_path).datamodule(0)
    data.setup()
    with pytest.raises(CorruptFileError) as err:
        list(data.test_dataloader())
    assert str(err.value).startswith(f"{broken}: not lines of 'x,y,z,nx,ny,nz' numbers")


def test_check_data_scans_every_shape_and_lists_each_broken_one(tmp_path, capsys):
    root = tmp_path / "modelnet40_normal_resampled"
    write_modelnet(root)
    argv = ["check-data", "--tasks", "modelnet40", "--data-root", str(tmp_path), "--workers", "2"]
    argv += ["--set", "data.num_classes=2"]
    assert main(argv) == 0
    assert "modelnet40: 8 files checked, ok" in capsys.readouterr().out
    three_columns = root / "table" / "table_0001.txt"
    three_columns.write_text("0.1,0.2,0.3\n0.4,0.5,0.6\n")
    garbage = root / "chair" / "chair_0102.txt"
    garbage.write_bytes(b"\x00\xff\xfe binary")
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "modelnet40: 8 files checked, 2 broken" in out
    assert f"BROKEN {three_columns}: 2 points of 3 values, expected lines of 'x,y,z,nx,ny,nz'" in out
    assert f"BROKEN {garbage}: not lines of" in out


def test_every_scannet_scene_is_checked_for_its_files_not_only_the_first(tmp_path):
    write_scannet(tmp_path / "scannet", scenes=3)
    missing = tmp_path / "scannet" / "val" / "scene0002_00" / "segment20.npy"
    missing.unlink()
    with pytest.raises(DatasetMissingError, match=f"1 files missing: {missing}"):
        scannet(tmp_path).check_data()


def test_a_scene_whose_labels_and_points_differ_in_length_names_the_file(tmp_path):
    write_scannet(tmp_path / "scannet")
    segment = tmp_path / "scannet" / "train" / "scene0001_00" / "segment20.npy"
    np.save(segment, np.zeros(299, dtype=np.int16))
    data = scannet(tmp_path).datamodule(0)
    data.setup()
    with pytest.raises(CorruptFileError) as err:
        [data.splits["train"][i] for i in range(2)]
    assert str(err.value) == f"{segment}: shape (299,), expected (300,) (coord.npy has 300 points)"


def test_a_garbage_npy_is_named_without_numpys_allow_pickle_hint(tmp_path):
    write_scannet(tmp_path / "scannet")
    garbage = tmp_path / "scannet" / "val" / "scene0000_00" / "color.npy"
    garbage.write_bytes(b"this is not an array" * 10)
    data = scannet(tmp_path).datamodule(0)
    data.setup()
    with pytest.raises(CorruptFileError) as err:
        data.splits["val"][0]
    message = str(err.value)
    assert message.startswith(f"{garbage}: not a readable NumPy .npy array") and "allow_pickle" not in message


def test_check_data_lists_every_broken_scene_file(tmp_path, capsys):
    write_scannet(tmp_path / "scannet", scenes=3)
    truncated = tmp_path / "scannet" / "train" / "scene0002_00" / "coord.npy"
    truncated.write_bytes(truncated.read_bytes()[:200])
    labels = tmp_path / "scannet" / "val" / "scene0001_00" / "segment20.npy"
    np.save(labels, np.full(300, 25, dtype=np.int16))
    assert main(["check-data", "--tasks", "scannet", "--data-root", str(tmp_path), "--workers", "2"]) == 1
    out = capsys.readouterr().out
    assert "scannet: 24 files checked, 2 broken" in out
    assert f"BROKEN {truncated}: not a readable NumPy .npy array" in out
    assert f"BROKEN {labels}: labels span 25..25, outside -1..19" in out
