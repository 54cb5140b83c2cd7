"""Readers of the real image datasets: ImageNet-1K as class folders, CIFAR's python release.

Every problem is an error naming the file or folder: a missing dataset, class folders that
differ between train/ and val/ (ImageFolder numbers classes by sorted folder name, so one
missing class shifts every later label), an empty class folder, an image that does not
decode, a CIFAR pickle that is truncated or holds the wrong arrays.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from pe_bench.harness.data import DatasetMissingError

from .._shared.data_checks import CorruptFileError, MalformedDatasetError, check_class_lists, some_names

IMAGEFOLDER_SPLITS = ("train", "val")


def imagefolder_root(data_root: Path | None, dataset_dir: str) -> Path:
    root = Path(data_root or ".") / dataset_dir
    problems = [f"{root / split} is missing" for split in IMAGEFOLDER_SPLITS if not (root / split).is_dir()]
    if not problems:
        empty = [s for s in IMAGEFOLDER_SPLITS if not any(p.is_dir() for p in (root / s).iterdir())]
        problems = [f"{root / s} has no class folders" for s in empty]
    if problems:
        raise DatasetMissingError(
            f"ImageNet-1K not found: {'; '.join(problems)}.\n"
            f"Expected layout under --data-root ({data_root}):\n"
            f"  {dataset_dir}/train/<wnid>/*.JPEG   (the 1000 class folders of ILSVRC2012 train)\n"
            f"  {dataset_dir}/val/<wnid>/*.JPEG     (the official validation set sorted into the same\n"
            f"                                   class folders, e.g. with the usual valprep.sh)\n"
            "Source: https://image-net.org/download (ILSVRC2012). pe-bench never downloads it."
        )
    return root


def _holds_an_image(folder: Path) -> bool:
    from torchvision.datasets.folder import IMG_EXTENSIONS

    # ImageFolder walks sub-folders too; the walk stops at the first image.
    return any(
        name.lower().endswith(IMG_EXTENSIONS) for _, _, names in os.walk(folder, followlinks=True) for name in names
    )


def imagefolder_classes(root: Path, num_classes: int) -> list[str]:
    """The class folders, the same in train/ and val/, ``num_classes`` of them, none empty."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

    lists = {str(root / split): find_classes(str(root / split))[0] for split in IMAGEFOLDER_SPLITS}
    check_class_lists(
        "ImageFolder dataset",
        lists,
        num_classes,
        "ImageFolder numbers classes by their sorted folder names: a class missing from one split shifts the "
        "label of every later class. Give train/ and val/ the same class folders.",
    )
    classes = lists[str(root / "train")]
    empty = [root / split / c for split in IMAGEFOLDER_SPLITS for c in classes if not _holds_an_image(root / split / c)]
    if empty:
        raise MalformedDatasetError(
            f"ImageFolder dataset: {len(empty)} class folders hold no image ({', '.join(IMG_EXTENSIONS)}): "
            f"{some_names(empty)}. Every class needs images in train/ and val/."
        )
    return classes


def read_image(path: str) -> Any:
    """ImageFolder's loader, with decode errors that name the file (PIL's do not)."""
    from PIL import Image

    try:
        with open(path, "rb") as handle:
            return Image.open(handle).convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise CorruptFileError(path, f"cannot be decoded as an image ({type(err).__name__}: {err})") from None


def imagefolder_files(root: Path, classes: list[str]) -> list[tuple[str, int]]:
    """(image, label) of both splits, as ImageFolder lists them."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    index = {c: i for i, c in enumerate(classes)}
    return [item for s in IMAGEFOLDER_SPLITS for item in make_dataset(str(root / s), index, IMG_EXTENSIONS)]


def check_image_file(item: tuple[str, int]) -> None:
    read_image(item[0])


# CIFAR's python release: folder, training files, test files, meta file, class-name key, label key.
CIFAR_RELEASE = {
    "cifar10": (
        "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), "batches.meta",
        "label_names", "labels",
    ),
    "cifar100": ("cifar-100-python", ("train",), ("test",), "meta", "fine_label_names", "fine_labels"),
}  # fmt: skip
CIFAR_ARCHIVE = {"cifar10": "cifar-10-python.tar.gz", "cifar100": "cifar-100-python.tar.gz"}
CIFAR_PIXELS = 3 * 32 * 32


def cifar_folder(data_root: Path | None, dataset_dir: str, source: str) -> Path:
    folder, train, test, meta, _, _ = CIFAR_RELEASE[source]
    root = Path(data_root or ".") / dataset_dir
    missing = [name for name in (meta, *train, *test) if not (root / folder / name).is_file()]
    if missing:
        where = root / folder
        what = f"{where} lacks {', '.join(missing)}" if where.is_dir() else f"{where} is missing"
        raise DatasetMissingError(
            f"{source.upper()} not found: {what}.\n"
            f"Expected layout under --data-root ({data_root}): {dataset_dir}/{folder}/ "
            f"(the extracted python version: {', '.join((meta, *train, *test))}).\n"
            f"Source: https://www.cs.toronto.edu/~kriz/{CIFAR_ARCHIVE[source]}. pe-bench never downloads it."
        )
    return root / folder


def _unpickle(path: Path, source: str) -> dict:
    try:
        with open(path, "rb") as handle:
            entry = pickle.load(handle, encoding="latin1")  # the release's own format (as torchvision reads it)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError) as err:
        raise CorruptFileError(
            path,
            f"not a readable CIFAR pickle, probably truncated ({type(err).__name__}: {err}); "
            f"extract it again from {CIFAR_ARCHIVE[source]}",
        ) from None
    if not isinstance(entry, dict):
        raise CorruptFileError(path, f"holds a {type(entry).__name__}, not CIFAR's dict of arrays")
    return entry


def cifar_class_names(folder: Path, source: str, num_classes: int) -> list[str]:
    _, _, _, meta, names_key, _ = CIFAR_RELEASE[source]
    entry = _unpickle(folder / meta, source)
    if names_key not in entry:
        raise CorruptFileError(folder / meta, f"has no {names_key!r} list")
    names = [str(n) for n in entry[names_key]]
    if len(names) != num_classes:
        raise MalformedDatasetError(f"{source}: data.num_classes={num_classes} but {folder / meta} names {len(names)}")
    return names


def read_cifar_batch(path: Path, source: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, 32, 32, 3) uint8 images and (N,) labels of one release file, checked."""
    label_key = CIFAR_RELEASE[source][5]
    entry = _unpickle(path, source)
    if "data" not in entry or label_key not in entry:
        raise CorruptFileError(path, f"has no 'data' and {label_key!r} entries (keys: {some_names(sorted(entry))})")
    data, labels = np.asarray(entry["data"]), np.asarray(entry[label_key])
    if data.ndim != 2 or data.shape[1] != CIFAR_PIXELS or data.dtype != np.uint8:
        raise CorruptFileError(path, f"'data' is {data.dtype} {data.shape}, expected uint8 (N, {CIFAR_PIXELS})")
    if labels.shape != (len(data),):
        raise CorruptFileError(path, f"{labels.shape} labels for {len(data)} images")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise CorruptFileError(path, f"labels span {labels.min()}..{labels.max()}, outside 0..{num_classes - 1}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels.astype(np.int64)


class CifarImages(Dataset):
    """(HWC uint8 image, label) pairs of one CIFAR split (``targets`` as torchvision names them)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.targets = images, labels

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.images[i], int(self.targets[i])


def cifar_split(folder: Path, source: str, train: bool, num_classes: int) -> CifarImages:
    files = CIFAR_RELEASE[source][1 if train else 2]
    batches = [read_cifar_batch(folder / name, source, num_classes) for name in files]
    return CifarImages(np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))


def cifar_release(folder: Path, source: str, num_classes: int) -> tuple[CifarImages, CifarImages]:
    """Training and test split; every class the meta file names has images in both."""
    _, train_files, test_files, meta, _, _ = CIFAR_RELEASE[source]
    names = cifar_class_names(folder, source, num_classes)
    train, test = (cifar_split(folder, source, t, num_classes) for t in (True, False))
    lists = {str(folder / meta): names}
    for files, split in ((train_files, train), (test_files, test)):
        lists[f"{folder}/{{{','.join(files)}}}"] = [names[i] for i in np.unique(split.targets)]
    check_class_lists(source, lists)
    return train, test


def check_cifar_file(item: tuple[Path, str, int]) -> None:
    read_cifar_batch(*item)
