"""Readers of the real datasets in the layouts Pointcept uses.

ModelNet40 (``modelnet40_normal_resampled``, Qi et al.'s PointNet++ release)::

    <root>/modelnet40_shape_names.txt          40 class names, one a line
    <root>/modelnet40_train.txt                shape ids (airplane_0001), one a line
    <root>/modelnet40_test.txt
    <root>/<class>/<class>_0001.txt            10000 lines "x,y,z,nx,ny,nz"

ScanNet v2 after Pointcept's ``preprocess_scannet.py``::

    <root>/{train,val,test}/scene0000_00/coord.npy     (n, 3) float, metres
                                        /color.npy     (n, 3) 0..255
                                        /normal.npy    (n, 3)
                                        /segment20.npy (n,) int, -1 = ignore
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pe_bench.harness.data import DatasetMissingError

from .._shared.data_checks import CorruptFileError, check_class_lists, some_names

MODELNET_LAYOUT = (
    "Expected the modelnet40_normal_resampled layout:\n"
    "  {root}/modelnet40_shape_names.txt, modelnet40_train.txt, modelnet40_test.txt\n"
    "  {root}/<class>/<class>_<nnnn>.txt   (lines 'x,y,z,nx,ny,nz')\n"
    "Source: https://shapenet.cs.stanford.edu/media/modelnet40_normal_resampled.zip (as used by\n"
    "PointNet++ and Pointcept). pe-bench never downloads it."
)

SCANNET_LAYOUT = (
    "Expected Pointcept's preprocessed ScanNet v2 layout:\n"
    "  {root}/train/<scene>/coord.npy, color.npy, normal.npy, segment20.npy\n"
    "  {root}/val/<scene>/...\n"
    "Source: ScanNet v2 (http://www.scan-net.org, terms of use apply), converted with Pointcept's\n"
    "pointcept/datasets/preprocessing/scannet/preprocess_scannet.py. pe-bench never downloads it."
)


def modelnet_index(root: Path, split: str) -> tuple[list[str], list[tuple[Path, int]]]:
    """Class names and (file, label) of ``split`` ("train"/"test"); raises DatasetMissingError."""
    names_file, split_file = root / "modelnet40_shape_names.txt", root / f"modelnet40_{split}.txt"
    missing = [p for p in (names_file, split_file) if not p.is_file()]
    if missing:
        raise DatasetMissingError(
            f"ModelNet40 not found: {', '.join(map(str, missing))} missing.\n" + MODELNET_LAYOUT.format(root=root)
        )
    names = [line.strip() for line in names_file.read_text().splitlines() if line.strip()]
    label_of = {name: i for i, name in enumerate(names)}
    items = []
    for shape in (line.strip() for line in split_file.read_text().splitlines()):
        if not shape:
            continue
        cls = shape.rsplit("_", 1)[0]
        if cls not in label_of:
            raise DatasetMissingError(f"ModelNet40: {split_file} lists {shape!r}, whose class is not in {names_file}")
        items.append((root / cls / f"{shape}.txt", label_of[cls]))
    if not items:
        raise DatasetMissingError(f"ModelNet40: {split_file} lists no shapes.\n" + MODELNET_LAYOUT.format(root=root))
    return names, items


def modelnet_splits(root: Path, num_classes: int) -> dict[str, list[tuple[Path, int]]]:
    """(file, label) of "train" and "test", after checking that both splits hold every class of
    the shape-names file, that it names ``num_classes``, and that every listed file exists."""
    (names, train), (_, test) = (modelnet_index(root, split) for split in ("train", "test"))
    check_class_lists(
        "ModelNet40",
        {
            str(root / "modelnet40_shape_names.txt"): names,
            str(root / "modelnet40_train.txt"): [names[label] for label in {y for _, y in train}],
            str(root / "modelnet40_test.txt"): [names[label] for label in {y for _, y in test}],
        },
        num_classes,
    )
    missing = [path for path, _ in (*train, *test) if not path.is_file()]
    if missing:
        raise DatasetMissingError(
            f"ModelNet40: {len(missing)} listed shape files are missing: {some_names(missing)}.\n"
            + MODELNET_LAYOUT.format(root=root)
        )
    return {"train": train, "test": test}


def read_modelnet_shape(path: Path, num_points: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The first ``num_points`` points (None: all) of a shape file, as Pointcept's
    ModelNetDataset reads them; a malformed file is an error naming it."""
    if not path.is_file():
        raise DatasetMissingError(f"ModelNet40: shape file {path} is missing.")
    try:
        data = np.loadtxt(path, delimiter=",", dtype=np.float32, max_rows=num_points, ndmin=2)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptFileError(path, f"not lines of 'x,y,z,nx,ny,nz' numbers ({err})") from None
    if data.shape[0] == 0 or data.shape[1] < 6:
        shape = f"{data.shape[0]} points of {data.shape[1]} values"
        raise CorruptFileError(path, f"{shape}, expected lines of 'x,y,z,nx,ny,nz'")
    if not np.isfinite(data[:, :6]).all():
        raise CorruptFileError(path, "holds non-finite coordinates or normals (nan/inf)")
    return data[:, :3], data[:, 3:6]


def check_modelnet_file(path: Path) -> None:
    read_modelnet_shape(path, None)


SCANNET_FILES = ("coord.npy", "color.npy", "normal.npy", "segment20.npy")


def scannet_scenes(root: Path, split: str) -> list[Path]:
    """Scene folders of ``split``; raises DatasetMissingError naming what is missing."""
    folder = root / split
    scenes = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not scenes:
        what = "is missing" if not folder.is_dir() else "has no scene folders"
        raise DatasetMissingError(f"ScanNet not found: {folder} {what}.\n" + SCANNET_LAYOUT.format(root=root))
    # Every scene, not only the first: a stat per file is cheap next to a failed run.
    incomplete = [s / f for s in scenes for f in SCANNET_FILES if not (s / f).is_file()]
    if incomplete:
        raise DatasetMissingError(
            f"ScanNet: {len(incomplete)} files missing: {some_names(incomplete)}.\n" + SCANNET_LAYOUT.format(root=root)
        )
    return scenes


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        # numpy says "allow_pickle=False" for any file without an .npy header: not the fix here.
        detail = "" if "allow_pickle" in str(err) else f" ({err})"
        raise CorruptFileError(path, f"not a readable NumPy .npy array{detail}; run the preprocessing again") from None


def read_scannet_scene(scene: Path, num_classes: int | None = None) -> dict[str, np.ndarray]:
    """One preprocessed scene, checked: per-point arrays of one length, (n, 3) finite
    coordinates, colours and normals, and (with ``num_classes``) labels in -1..num_classes-1."""
    raw = {f.removesuffix(".npy"): _load_npy(scene / f) for f in SCANNET_FILES}
    count = len(raw["coord"])
    for key, array in raw.items():
        expected = (count,) if key == "segment20" else (count, 3)
        if array.shape != expected and not (key == "segment20" and array.shape == (count, 1)):
            raise CorruptFileError(
                scene / f"{key}.npy", f"shape {array.shape}, expected {expected} (coord.npy has {count} points)"
            )
    if not np.isfinite(raw["coord"]).all():
        raise CorruptFileError(scene / "coord.npy", "holds non-finite coordinates (nan/inf)")
    segment = raw["segment20"].astype(np.int64).reshape(-1)
    if num_classes is not None and count and (segment.min() < -1 or segment.max() >= num_classes):
        raise CorruptFileError(
            scene / "segment20.npy", f"labels span {segment.min()}..{segment.max()}, outside -1..{num_classes - 1}"
        )
    as_float = {key: raw[key].astype(np.float32) for key in ("coord", "color", "normal")}
    return as_float | {"segment": segment}


def check_scannet_scene(item: tuple[Path, int]) -> None:
    read_scannet_scene(*item)
