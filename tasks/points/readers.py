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


def read_modelnet_shape(path: Path, num_points: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``num_points`` points of a shape file, as Pointcept's ModelNetDataset reads them."""
    if not path.is_file():
        raise DatasetMissingError(f"ModelNet40: shape file {path} is missing.")
    data = np.loadtxt(path, delimiter=",", dtype=np.float32, max_rows=num_points, ndmin=2)
    return data[:, :3], data[:, 3:6]


SCANNET_FILES = ("coord.npy", "color.npy", "normal.npy", "segment20.npy")


def scannet_scenes(root: Path, split: str) -> list[Path]:
    """Scene folders of ``split``; raises DatasetMissingError naming what is missing."""
    folder = root / split
    scenes = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not scenes:
        what = "is missing" if not folder.is_dir() else "has no scene folders"
        raise DatasetMissingError(f"ScanNet not found: {folder} {what}.\n" + SCANNET_LAYOUT.format(root=root))
    incomplete = [s / f for s in scenes[:1] for f in SCANNET_FILES if not (s / f).is_file()]
    if incomplete:
        raise DatasetMissingError(
            f"ScanNet: {', '.join(map(str, incomplete))} missing.\n" + SCANNET_LAYOUT.format(root=root)
        )
    return scenes


def read_scannet_scene(scene: Path) -> dict[str, np.ndarray]:
    out = {f.removesuffix(".npy"): np.load(scene / f) for f in SCANNET_FILES}
    out["segment"] = out.pop("segment20").astype(np.int64).reshape(-1)
    out["coord"] = out["coord"].astype(np.float32)
    out["color"] = out["color"].astype(np.float32)
    out["normal"] = out["normal"].astype(np.float32)
    return out
