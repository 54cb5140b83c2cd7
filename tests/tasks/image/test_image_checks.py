"""Real image datasets on tiny fixtures written in the real formats: class lists of every split
agree, corrupt files are named, the corrupt-sample policy, ``pe-bench check-data``."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from PIL import Image

from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.harness.grid import store
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.data_checks import CorruptFileError, MalformedDatasetError

CLASSES = ("n01", "n02", "n03")


def write_imagefolder(root, train=CLASSES, val=CLASSES, per_class=3, side=16):
    """ImageNet's layout: <root>/imagenet/{train,val}/<wnid>/*.JPEG, each class a colour."""
    rng = np.random.default_rng(0)
    for split, classes in (("train", train), ("val", val)):
        for wnid in classes:
            folder = root / "imagenet" / split / wnid
            folder.mkdir(parents=True)
            for k in range(per_class):
                pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{wnid}_{k}.JPEG", quality=90)
    return root / "imagenet"


def truncate(path, keep=0.4):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


SMALL = {
    "model": {"dim": 16, "depth": 1, "num_heads": 2, "patch_size": 8, "drop_path": 0.0},
    "optim": {"batch_size": 4, "epochs": 1, "warmup_epochs": 0},
    "trainer": {"num_workers": 0},
    "data": {"num_classes": 3, "image_size": 16, "val_fraction": 0.34, "randaugment": False},
}


def imagenet(data_root, **data):
    overrides = {**SMALL, "data": SMALL["data"] | data}
    return get_task("imagenet")(load_run_config("imagenet", "paper", overrides), data_root)


def all_batches(module, split):
    loader = {"train": module.train_dataloader, "val": module.val_dataloader, "test": module.test_dataloader}[split]
    return [labels for _, labels in loader()]


# -- item 1: class lists of every split agree --------------------------------------------


def test_val_lacking_a_class_of_train_is_an_error_naming_folder_and_class(tmp_path):
    root = write_imagefolder(tmp_path, val=("n01", "n02"))
    task = imagenet(tmp_path)
    with pytest.raises(MalformedDatasetError) as err:
        task.check_data()
    message = str(err.value)
    assert f"{root / 'val'} lacks 1 classes of {root / 'train'}: n03" in message
    assert "shifts the label" in message
    module = task.datamodule(0)
    with pytest.raises(MalformedDatasetError, match="n03"):  # also where the data is loaded
        module.setup()


def test_val_with_an_extra_class_and_num_classes_mismatch_are_named(tmp_path):
    root = write_imagefolder(tmp_path, val=(*CLASSES, "n04"))
    with pytest.raises(MalformedDatasetError) as err:
        imagenet(tmp_path, num_classes=1000).check_data()
    message = str(err.value)
    assert f"data.num_classes=1000 but {root / 'train'} has 3 classes" in message
    assert f"{root / 'val'} has 1 classes that {root / 'train'} lacks: n04" in message


def test_the_grid_stops_before_training_when_class_lists_disagree(tmp_path, capsys):
    write_imagefolder(tmp_path, val=("n01", "n02"))
    sets = [arg for key in ("data.num_classes=3", "data.image_size=16", "model.patch_size=8") for arg in ("--set", key)]
    argv = ["run", "--tasks", "imagenet", "--methods", "rope", "--profile", "paper", "--data-root", str(tmp_path)]
    assert main([*argv, "--out", str(tmp_path / "out"), *sets]) == 2
    assert "lacks 1 classes" in capsys.readouterr().err
    assert not (tmp_path / "out" / "runs").exists()


# -- item 11: empty class folders, corrupt images, the corrupt-sample policy -------------


def test_an_empty_class_folder_is_named(tmp_path):
    root = write_imagefolder(tmp_path)
    for image in (root / "val" / "n02").iterdir():
        image.unlink()
    with pytest.raises(MalformedDatasetError, match=f"hold no image.*{root / 'val' / 'n02'}"):
        imagenet(tmp_path).check_data()


def test_a_truncated_jpeg_is_an_error_naming_the_file(tmp_path):
    root = write_imagefolder(tmp_path)
    broken = root / "val" / "n02" / "n02_1.JPEG"
    truncate(broken)
    module = imagenet(tmp_path).datamodule(0)
    module.setup()
    with pytest.raises(CorruptFileError) as err:
        all_batches(module, "test")
    assert str(broken) in str(err.value) and "cannot be decoded" in str(err.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_images_within_the_fraction_are_skipped_and_counted(tmp_path, workers):
    root = write_imagefolder(tmp_path, per_class=4)
    truncate(root / "train" / "n01" / "n01_0.JPEG")
    truncate(root / "val" / "n03" / "n03_2.JPEG", keep=0.0)  # an empty file
    task = imagenet(tmp_path, max_corrupt_fraction=0.2)
    module = task.datamodule(0)
    module.num_workers = workers  # the count is shared by DataLoader worker processes
    module.setup()
    for split in ("train", "val", "test"):
        sizes = [len(labels) for labels in all_batches(module, split)]
        assert sum(sizes) >= len(module.splits[split]) - 1  # a corrupt sample is replaced, not dropped
    assert module.extra_results() == {"corrupt_samples": 2}


def test_more_corrupt_images_than_the_fraction_allows_is_an_error(tmp_path):
    root = write_imagefolder(tmp_path, per_class=4)
    for k in range(3):
        truncate(root / "val" / "n01" / f"n01_{k}.JPEG")
    module = imagenet(tmp_path, max_corrupt_fraction=0.1).datamodule(0)  # 1 of 12 allowed
    module.setup()
    with pytest.raises(MalformedDatasetError, match=r"2 of 12 files are corrupt, more than data.max_corrupt_fraction"):
        all_batches(module, "test")


def test_the_corrupt_count_lands_in_the_cell_record(tmp_path):
    root = write_imagefolder(tmp_path, per_class=4)
    truncate(root / "train" / "n02" / "n02_3.JPEG")
    sets = ["data.num_classes=3", "data.image_size=16", "model.patch_size=8", "model.dim=16", "model.depth=1",
            "model.num_heads=2", "optim.batch_size=4", "optim.epochs=1", "trainer.num_workers=0",
            "data.val_fraction=0.34", "data.randaugment=false", "data.max_corrupt_fraction=0.1"]  # fmt: skip
    argv = ["run", "--tasks", "imagenet", "--methods", "nopos", "--profile", "paper", "--data-root", str(tmp_path)]
    assert main([*argv, "--out", str(tmp_path / "out"), *[a for s in sets for a in ("--set", s)]]) == 0
    record = json.loads((store.cell_dir(tmp_path / "out", "imagenet", "nopos", 0) / "result.json").read_text())
    assert record["status"] == "ok" and record["extra"]["corrupt_samples"] == 1


def test_max_corrupt_fraction_is_bounded(tmp_path):
    from pe_bench.harness.config import ConfigError

    with pytest.raises(ConfigError, match="data: max_corrupt_fraction"):
        imagenet(tmp_path, max_corrupt_fraction=1.5)


def test_check_data_scans_every_image_and_lists_each_broken_one(tmp_path, capsys):
    root = write_imagefolder(tmp_path)
    argv = ["check-data", "--tasks", "imagenet", "--data-root", str(tmp_path), "--set", "data.num_classes=3"]
    assert main([*argv, "--workers", "2"]) == 0
    assert "imagenet: 18 files checked, ok" in capsys.readouterr().out
    broken = [root / "train" / "n01" / "n01_2.JPEG", root / "val" / "n03" / "n03_0.JPEG"]
    for path in broken:
        truncate(path)
    assert main([*argv, "--workers", "2"]) == 1
    out = capsys.readouterr().out
    assert "imagenet: 18 files checked, 2 broken" in out
    assert all(f"BROKEN {path}: cannot be decoded" in out for path in broken)


def test_check_data_reports_class_list_problems_and_exits_1(tmp_path, capsys):
    write_imagefolder(tmp_path, val=("n01", "n02"))
    assert main(["check-data", "--tasks", "imagenet", "--data-root", str(tmp_path), "--set", "data.num_classes=3"]) == 1
    out = capsys.readouterr().out
    assert "imagenet: FAILED" in out and "n03" in out and "0 of 1 datasets ok; problems: imagenet" in out


# -- CIFAR's python release ---------------------------------------------------------------


def write_cifar10(root, per_class=2, test_classes=range(10), names=None):
    """<root>/cifar10/cifar-10-batches-py with five training batches, a test batch and batches.meta."""
    folder = root / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)

    def batch(name, labels):
        data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
        with open(folder / name, "wb") as handle:
            pickle.dump({"batch_label": name, "labels": list(labels), "data": data}, handle)

    for i in range(1, 6):
        batch(f"data_batch_{i}", [c for c in range(10) for _ in range(per_class)])
    batch("test_batch", [c for c in test_classes for _ in range(per_class)])
    names = names or [f"class{c}" for c in range(10)]
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({"label_names": names, "num_vis": 3072}, handle)
    return folder


def cifar10(data_root):
    overrides = {"trainer": {"num_workers": 0}, "optim": {"batch_size": 8}, "data": {"val_fraction": 0.1}}
    return get_task("cifar10")(load_run_config("cifar10", "paper", overrides), data_root)


def test_cifar_release_files_are_read_with_their_labels(tmp_path):
    write_cifar10(tmp_path)
    task = cifar10(tmp_path)
    assert task.check_data(full=True).ok
    module = task.datamodule(0)
    module.setup()
    assert [len(module.splits[s]) for s in ("train", "val", "test")] == [90, 10, 20]
    images, labels = next(iter(module.test_dataloader()))
    assert images.shape == (8, 3, 32, 32) and labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_truncated_cifar_pickle_is_named_without_download_advice(tmp_path):
    folder = write_cifar10(tmp_path)
    truncate(folder / "data_batch_3", keep=0.5)
    module = cifar10(tmp_path).datamodule(0)
    with pytest.raises(CorruptFileError) as err:
        module.setup()
    message = str(err.value)
    assert message.startswith(f"{folder / 'data_batch_3'}: not a readable CIFAR pickle")
    assert "download=True" not in message and "cifar-10-python.tar.gz" in message
    report = cifar10(tmp_path).check_data(full=True, workers=2)
    assert report.checked == 6 and [path for path, _ in report.broken] == [str(folder / "data_batch_3")]


def test_cifar_meta_and_splits_must_name_the_same_classes(tmp_path):
    write_cifar10(tmp_path / "a", names=[f"class{c}" for c in range(9)])
    with pytest.raises(MalformedDatasetError, match="data.num_classes=10 but .*batches.meta names 9"):
        cifar10(tmp_path / "a").check_data()
    write_cifar10(tmp_path / "b", test_classes=range(9))
    with pytest.raises(MalformedDatasetError, match=r"test_batch.* lacks 1 classes of .*batches.meta: class9"):
        cifar10(tmp_path / "b").datamodule(0).setup()
