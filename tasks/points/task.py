"""Point clouds with a PTv3-style backbone: ``modelnet40`` classification, ``scannet`` segmentation.

``paper`` profiles read ModelNet40 (modelnet40_normal_resampled) and Pointcept's preprocessed
ScanNet from ``--data-root``; ``tiny`` profiles use the generated shapes and rooms of
:mod:`.points_synthetic`. The backbone's stage structure is the typed ``model.ptv3`` section
(:class:`PointsModelConfig`); the rest of ``model`` is what every task has: first-stage width
and heads, total depth (they must agree with ``model.ptv3``), patch size, MLP ratio, drop path.
"""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from pe_bench.adapters import EncodingFactory, Geometry
from pe_bench.harness.config import ConfigError, ModelConfig, Strict
from pe_bench.harness.data import stratified_split

from ..base import Task
from .data import Augment, FeatureKey, PointDataModule, PointDataset
from .module import PointClassificationModule, PointClassifier, PointSegmentationModule, PointSegmenter
from .ptv3 import PointBatch, PTv3, PTv3Config, points_geometry
from .readers import modelnet_index, read_modelnet_shape, read_scannet_scene, scannet_scenes
from .synthetic import ROOM_CLASSES, room_dataset, shape_dataset


class PointsDataConfig(Strict):
    source: Literal["synthetic", "modelnet40", "scannet"]
    num_classes: int
    grid_size: float
    dataset_dir: str = ""  # under --data-root
    feat_keys: list[FeatureKey]
    num_points: int = 8192  # ModelNet40: points read per shape (Pointcept's default)
    val_fraction: float = 0.05  # ModelNet40 has no val split: stratified hold-out of train
    # synthetic only
    train_size: int = 0
    val_size: int = 0
    test_size: int = 0
    room_density: float = 60.0  # points per m^2 of the generated rooms
    train_aug: Augment = Augment()
    eval_aug: Augment = Augment()


class PointsModelConfig(ModelConfig):
    ptv3: PTv3Config = PTv3Config()


@lru_cache(maxsize=4)
def _shapes(count: int, num_points: int, num_classes: int, seed: int) -> tuple[list, np.ndarray]:
    return shape_dataset(count, num_points, num_classes, seed)


@lru_cache(maxsize=4)
def _rooms(count: int, seed: int, density: float) -> list[dict]:
    return room_dataset(count, seed, density)


class PointTask(Task):
    DataConfig = PointsDataConfig
    data: PointsDataConfig
    ModelConfig = PointsModelConfig
    mode: Literal["cls", "seg"] = "cls"

    def __init__(self, config, data_root: Path | None = None) -> None:
        super().__init__(config, data_root)
        m = config.model
        b = m.ptv3
        total = sum(b.enc_depths) + (sum(b.dec_depths) if self.mode == "seg" else 0)
        expected = {"dim": b.enc_channels[0], "num_heads": b.enc_num_head[0], "depth": total}
        wrong = [
            f"model.{k}={getattr(m, k)} but model.ptv3 says {v}" for k, v in expected.items() if getattr(m, k) != v
        ]
        if wrong:
            raise ConfigError(f"{config.task}/{config.profile}: " + "; ".join(wrong))

    def geometry(self) -> Geometry:
        b = self.config.model.ptv3
        scale = b.position_scale if b.position_scale is not None else 1.0 / self.data.grid_size
        return points_geometry(self.data.grid_size, scale)

    def backbone(self, make_encoding: EncodingFactory) -> PTv3:
        m = self.config.model
        in_channels = 3 * len(self.data.feat_keys)
        return PTv3(
            make_encoding, self.geometry(), m.ptv3, in_channels, self.data.grid_size, self.mode,
            m.patch_size, m.mlp_ratio, m.drop_path,
        )  # fmt: skip

    def datamodule(self, seed: int) -> PointDataModule:
        return PointDataModule(self._splits, self.config.optim.batch_size, self.config.trainer.num_workers, seed)

    def _dataset(self, load, size: int, train: bool) -> PointDataset:
        aug = self.data.train_aug if train else self.data.eval_aug
        return PointDataset(load, size, aug, self.data.grid_size, self.data.feat_keys, train)

    def _splits(self) -> dict[str, Dataset]:
        raise NotImplementedError

    @classmethod
    def benchmark(cls, device: str = "cpu") -> str:
        """Eval forward time of the backbone (tiny and paper profiles) on 10k and 100k points."""
        from pe_bench.harness.config import load_run_config

        rows = ["| profile | points | parameters | forward (s) |", "|---|---:|---:|---:|"]
        for profile in _BENCH_PROFILES:
            task = cls(load_run_config(cls.name, profile))
            torch.manual_seed(0)
            model = task.backbone(EncodingFactory("nopos")).eval().to(device)
            params = sum(p.numel() for p in model.parameters())
            for n in _BENCH_SIZES:
                points = _random_scene(n, task.data.grid_size, 3 * len(task.data.feat_keys), device)
                with torch.inference_mode():
                    model(points)  # warm-up (allocator, neighbour-table code paths)
                    _sync(device)
                    start = time.perf_counter()
                    model(points)
                    _sync(device)
                    seconds = time.perf_counter() - start
                rows.append(f"| {profile} | {n} | {params / 1e6:.2f}M | {seconds:.3f} |")
        head = (
            f"PTv3 {cls.mode} backbone, eval forward of one scene, nopos, {device}, {torch.get_num_threads()} threads:"
        )
        return "\n".join([head, "", *rows])


_BENCH_SIZES = (10_000, 100_000)
_BENCH_PROFILES = ("tiny", "paper")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _random_scene(n: int, grid_size: float, channels: int, device: str) -> PointBatch:
    """n points on distinct voxels of a room-sized surface-like slab."""
    side = int(np.ceil(np.sqrt(n * 2)))
    flat = torch.randperm(side * side * 4)[:n]
    grid = torch.stack([flat // (side * 4), (flat // 4) % side, flat % 4], dim=1)
    coord = grid.float() * grid_size
    return PointBatch(
        coord.to(device), grid.to(device), torch.zeros(n, dtype=torch.long, device=device),
        torch.randn(n, channels, device=device),
    )  # fmt: skip


class ModelNet40(PointTask):
    name = "modelnet40"
    mode = "cls"
    tiny_standin = "generated shapes (8 solids seen from one side, random heading, stretch, scale, shift, jitter)"

    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        return PointClassifier(self.backbone(make_encoding), self.data.num_classes)

    def lightning_module(self, model: nn.Module) -> PointClassificationModule:
        return PointClassificationModule(model, self.data.num_classes, self.config.optim)

    def _root(self) -> Path:
        return Path(self.data_root or ".") / self.data.dataset_dir

    def check_data(self) -> None:
        if self.data.source == "modelnet40":
            for split in ("train", "test"):
                modelnet_index(self._root(), split)

    def _splits(self) -> dict[str, Dataset]:
        d = self.data
        if d.source == "synthetic":
            sizes = {"train": d.train_size, "val": d.val_size, "test": d.test_size}
            out = {}
            for offset, (split, size) in enumerate(sizes.items()):
                clouds, labels = _shapes(size, d.num_points, d.num_classes, 2000 + offset)
                load = _shape_loader(clouds, labels, np.arange(size))
                out[split] = self._dataset(load, size, split == "train")
            return out
        if d.source != "modelnet40":
            raise ConfigError(f"modelnet40: data.source {d.source!r} is not a ModelNet40 source")
        _, train_items = modelnet_index(self._root(), "train")
        _, test_items = modelnet_index(self._root(), "test")
        train_idx, val_idx = stratified_split(np.array([y for _, y in train_items]), d.val_fraction)

        def files(items, idx):
            chosen = [items[i] for i in idx]
            return lambda i: _modelnet_sample(*chosen[i], d.num_points), len(chosen)

        (tl, tn), (vl, vn), (el, en) = (
            files(train_items, train_idx),
            files(train_items, val_idx),
            files(test_items, np.arange(len(test_items))),
        )
        return {
            "train": self._dataset(tl, tn, True),
            "val": self._dataset(vl, vn, False),
            "test": self._dataset(el, en, False),
        }


def _shape_loader(clouds: list, labels: np.ndarray, index: np.ndarray):
    def load(i: int) -> dict:
        points, normals = clouds[index[i]]
        return {"coord": points, "normal": normals, "label": int(labels[index[i]])}

    return load


def _modelnet_sample(path: Path, label: int, num_points: int) -> dict:
    coord, normal = read_modelnet_shape(path, num_points)
    return {"coord": coord, "normal": normal, "label": label}


class ScanNet(PointTask):
    name = "scannet"
    mode = "seg"
    metric = "miou"
    metric_label = "mIoU (%)"
    tiny_standin = (
        f"generated rooms ({len(ROOM_CLASSES)} classes: floor, walls, beds, tables, chairs, cabinets and "
        "bookshelves at characteristic heights)"
    )

    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        return PointSegmenter(self.backbone(make_encoding), self.data.num_classes)

    def lightning_module(self, model: nn.Module) -> PointSegmentationModule:
        return PointSegmentationModule(model, self.data.num_classes, self.config.optim)

    def _root(self) -> Path:
        return Path(self.data_root or ".") / self.data.dataset_dir

    def check_data(self) -> None:
        if self.data.source == "scannet":
            for split in ("train", "val"):
                scannet_scenes(self._root(), split)

    def _splits(self) -> dict[str, Dataset]:
        d = self.data
        if d.source == "synthetic":
            if d.num_classes != len(ROOM_CLASSES):
                raise ConfigError(f"scannet/synthetic: the rooms have {len(ROOM_CLASSES)} classes, not {d.num_classes}")
            sizes = {"train": d.train_size, "val": d.val_size, "test": d.test_size}
            out = {}
            for offset, (split, size) in enumerate(sizes.items()):
                rooms = _rooms(size, 3000 + offset, d.room_density)
                out[split] = self._dataset(rooms.__getitem__, size, split == "train")
            return out
        if d.source != "scannet":
            raise ConfigError(f"scannet: data.source {d.source!r} is not a ScanNet source")
        train, val = (scannet_scenes(self._root(), s) for s in ("train", "val"))
        # ScanNet's test labels are hidden: the val split selects the checkpoint and is reported,
        # as in PTv3 and Pointcept.
        return {
            "train": self._dataset(lambda i: read_scannet_scene(train[i]), len(train), True),
            "val": self._dataset(lambda i: read_scannet_scene(val[i]), len(val), False),
            "test": self._dataset(lambda i: read_scannet_scene(val[i]), len(val), False),
        }
