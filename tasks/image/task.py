"""Image classification with a ViT: ``imagenet``, ``cifar10``, ``cifar100``.

``paper`` profiles read the real datasets from ``--data-root``; ``tiny`` profiles use the
generated relation images of :mod:`.synthetic_images`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from pe_bench.adapters import EncodingFactory, Geometry
from pe_bench.harness.config import ConfigError, RunConfig, Strict
from pe_bench.harness.data import PatchDataModule, stratified_split
from pe_bench.harness.module import ClassificationModule
from pe_bench.tasks._shared.vit import ViT, image_geometry

from .._shared.data_checks import (
    CorruptSampleLog,
    DataReport,
    first_readable,
    refuse_ignored_augmentations,
    refuse_moving_augmentations,
    scan_files,
    share_seen,
)
from ..base import PatchTask
from . import readers
from .resolution import ComposeBatch, RandomBatchResolution, ResizeTTA, check_sides
from .synthetic import (
    EpochBlocks,
    FreshRelationImages,
    placements_not_seen,
    relation_images,
    relation_images_with_pairs,
    split_pairs,
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class ImageDataConfig(Strict):
    source: Literal["synthetic", "imagefolder", "cifar10", "cifar100"]
    image_size: int = Field(ge=1)
    num_classes: int = Field(ge=2)
    channels: int = Field(3, ge=1)
    dataset_dir: str = ""  # under --data-root
    val_fraction: float = Field(0.01, ge=0.0, lt=1.0)  # stratified hold-out of train (PaPE App. E: 1%)
    # imagefolder: 0 makes a corrupt image an error naming it; f > 0 skips corrupt images (up
    # to that fraction of the files) and records their count (see tasks/_shared/data_checks.py).
    max_corrupt_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    # synthetic only
    train_size: int = Field(0, ge=0)
    val_size: int = Field(0, ge=0)
    test_size: int = Field(0, ge=0)
    distractors: int = Field(2, ge=0)
    noise: float = Field(0.15, ge=0.0)
    # New training images every epoch (train_size of them; no image is seen twice) instead of
    # one fixed training set: the stand-in then gives no reward for fitting images by their
    # placements (README, Stable seeds). Validation and test sets stay fixed.
    fresh_train_images: bool = False
    # A fraction of every direction class's (anchor cell, target cell) placements that training
    # and validation never show; the test split holds only those (synthetic.split_pairs). With
    # 0 (the default) 95-98 % of test images repeat a training image's placement, so a test score
    # cannot tell the relation from a lookup of placements; held out, it measures the relation.
    held_out_pairs: float = Field(0.0, ge=0.0, lt=1.0)
    # augmentation (paper profiles)
    randaugment: bool = False
    hflip: bool = False
    random_resized_crop: bool = False
    mixup_alpha: float = Field(0.0, ge=0.0)
    cutmix_alpha: float = Field(0.0, ge=0.0)
    # UniViT (CAPE §5.1.2): every training batch resized to a side drawn from this list
    # (the paper: [128, 160, ..., 320]); empty trains at image_size only.
    train_sides: list[int] = []
    # Resize test-time augmentation (CAPE §5.1.3): mean logits at image_size -/+ this many
    # pixels and at image_size itself (the paper: 32); 0 is off.
    tta_delta: int = Field(0, ge=0)


@lru_cache(maxsize=8)
def _synthetic_splits(
    num_classes: int, grid: tuple[int, int], patch: int, channels: int, sizes: tuple[int, int, int], distractors: int,
    noise: float, seen: frozenset | None = None, unseen: frozenset | None = None,
) -> tuple[tuple[TensorDataset, TensorDataset, TensorDataset], tuple[list, list, list]]:  # fmt: skip
    """The train, val and test sets (train and val on the ``seen`` placements, test on the
    ``unseen`` ones; None: any) and the (anchor, target) placement of each of their images."""
    splits, placements = [], []
    # Fixed data seeds per split: every run of every method sees the same data.
    for offset, (count, pairs) in enumerate(zip(sizes, (seen, seen, unseen), strict=True)):
        x, y, where = relation_images_with_pairs(
            count, num_classes, grid, patch, channels, distractors, noise, seed=1000 + offset, pairs=pairs
        )
        splits.append(TensorDataset(x, y))
        placements.append(where)
    return tuple(splits), tuple(placements)  # type: ignore[return-value]


def _transforms(
    data: ImageDataConfig, train: bool, mean: tuple, std: tuple, eval_size: tuple[int, int] | None = None
) -> Any:
    """Training or evaluation transforms; ``eval_size`` (H, W) evaluates at another resolution."""
    from torchvision.transforms import v2

    size = data.image_size
    steps: list[Any] = [v2.ToImage()]
    if eval_size is not None and not train:
        # Resize the shorter side as the usual 0.875 crop ratio does, then centre-crop (H, W).
        steps += [v2.Resize(int(max(eval_size) / 0.875), antialias=True), v2.CenterCrop(eval_size)]
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
        return v2.Compose(steps)
    if train:
        crop = v2.RandomResizedCrop(size, antialias=True) if data.random_resized_crop else v2.Resize((size, size))
        steps.append(crop)
        if data.hflip:
            steps.append(v2.RandomHorizontalFlip())
        if data.randaugment:
            steps.append(v2.RandAugment())
    elif size >= 64:
        steps += [v2.Resize(int(size / 0.875), antialias=True), v2.CenterCrop(size)]
    else:
        steps.append(v2.Resize((size, size), antialias=True))
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
    return v2.Compose(steps)


class _Transformed(Dataset):
    """A subset of a dataset with its own transform (train and val share files). With a
    ``corrupt`` log, a sample that does not decode is replaced by the next readable one of
    the subset, as ``data.max_corrupt_fraction`` allows."""

    def __init__(
        self, base: Dataset, indices: np.ndarray | None, transform: Any, corrupt: CorruptSampleLog | None = None
    ) -> None:
        self.base, self.transform, self.corrupt = base, transform, corrupt
        self.indices = np.arange(len(base)) if indices is None else np.asarray(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.corrupt is None:
            image, label = self.base[int(self.indices[i])]
        else:
            image, label = first_readable(
                lambda j: self.base[int(self.indices[j])], i, len(self), self.corrupt, lambda j: int(self.indices[j])
            )
        return self.transform(image), label


def imagefolder(data_root: Path | None, data: ImageDataConfig, split: str) -> tuple[Any, CorruptSampleLog]:
    """One split of the class-folder dataset (class lists checked) and its corrupt-sample log."""
    from torchvision.datasets import ImageFolder

    root = readers.imagefolder_root(data_root, data.dataset_dir)
    readers.imagefolder_classes(root, data.num_classes)
    folder = ImageFolder(str(root / split), loader=readers.read_image)
    return folder, CorruptSampleLog(len(folder), data.max_corrupt_fraction, f"ImageFolder {root / split}")


def cifar(data_root: Path | None, data: ImageDataConfig) -> tuple[readers.CifarImages, readers.CifarImages]:
    folder = readers.cifar_folder(data_root, data.dataset_dir, data.source)
    return readers.cifar_release(folder, data.source, data.num_classes)


class ImageDataModule(PatchDataModule):
    data: ImageDataConfig

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        data = self.data
        if data.source == "synthetic":
            sizes = (data.train_size, data.val_size, data.test_size)
            grid = (data.image_size // self.patch,) * 2
            pairs = split_pairs(grid, data.num_classes, data.held_out_pairs) if data.held_out_pairs else None
            seen, unseen = pairs or (None, None)
            (train, val, test), placements = _synthetic_splits(
                data.num_classes, grid, self.patch, data.channels, sizes, data.distractors, data.noise, seen, unseen
            )
            self.test_placements_seen = share_seen(placements[0], placements[2])
            if data.fresh_train_images:
                train = FreshRelationImages(
                    data.train_size, data.num_classes, grid, self.patch, data.channels, data.distractors, data.noise,
                    seen,
                )  # fmt: skip
                if seen is not None:  # every epoch draws new images, all from the seen placements
                    self.test_placements_seen = share_seen(seen, placements[2])
        elif data.source == "imagefolder":
            full, full_log = imagefolder(self.data_root, data, "train")
            held_out, held_out_log = imagefolder(self.data_root, data, "val")
            self.corrupt_logs = [full_log, held_out_log]
            train_idx, val_idx = stratified_split(np.asarray(full.targets), data.val_fraction)
            train_tf, eval_tf = (_transforms(data, t, IMAGENET_MEAN, IMAGENET_STD) for t in (True, False))
            tolerant = data.max_corrupt_fraction > 0
            train = _Transformed(full, train_idx, train_tf, full_log if tolerant else None)
            val = _Transformed(full, val_idx, eval_tf, full_log if tolerant else None)
            test = _Transformed(held_out, None, eval_tf, held_out_log if tolerant else None)
        else:
            (full, held_out), mean, std = cifar(self.data_root, data), CIFAR_MEAN, CIFAR_STD
            train_idx, val_idx = stratified_split(full.targets, data.val_fraction)
            train = _Transformed(full, train_idx, _transforms(data, True, mean, std))
            val = _Transformed(full, val_idx, _transforms(data, False, mean, std))
            test = _Transformed(held_out, None, _transforms(data, False, mean, std))
        self.splits = {"train": train, "val": val, "test": test}

    def train_dataloader(self) -> DataLoader:
        train = self.splits["train"]
        if not isinstance(train, FreshRelationImages):
            return super().train_dataloader()
        if self.trainer is not None and self.trainer.world_size > 1:
            # Lightning would wrap EpochBlocks in a DistributedSamplerWrapper, which does not pass
            # set_epoch on: every epoch would re-read block 0, a fixed set under another name.
            raise ConfigError(
                "data.fresh_train_images runs in one process only (a tiny-profile option); "
                "drop it, or run the cell without DDP"
            )
        return self.loader(train, order=EpochBlocks(len(train), self.seed))

    def extra_results(self) -> dict[str, float]:
        """For the record: ``corrupt_samples``, images skipped under ``data.max_corrupt_fraction`` > 0;
        with ``data.held_out_pairs``, the share of test images whose placement training showed
        (measured on the splits, 0 when the hold-out works)."""
        if self.data.source == "synthetic" and self.data.held_out_pairs:
            self.setup()
            return {"test_placements_seen_in_training": self.test_placements_seen}
        if self.data.source != "imagefolder" or self.data.max_corrupt_fraction == 0:
            return {}
        return {"corrupt_samples": sum(log.count() for log in getattr(self, "corrupt_logs", []))}

    def test_set_at(self, height: int, width: int) -> Dataset:
        """The test split at another resolution, for extrapolation (PaPE Appendix B). Synthetic
        data is regenerated on the larger patch grid (a bigger image holds more patches)."""
        data = self.data
        if data.source == "synthetic":
            grid = (height // self.patch, width // self.patch)
            pairs = None
            if data.held_out_pairs:  # still none of the placements training showed
                train_grid = (data.image_size // self.patch,) * 2
                seen, _ = split_pairs(train_grid, data.num_classes, data.held_out_pairs)
                pairs = placements_not_seen(grid, train_grid, seen, data.num_classes)
            x, y = relation_images(
                data.test_size, data.num_classes, grid, self.patch, data.channels, data.distractors, data.noise,
                seed=5000 + 97 * height + width, pairs=pairs,
            )  # fmt: skip
            return TensorDataset(x, y)
        if data.source == "imagefolder":
            held_out, log = imagefolder(self.data_root, data, "val")
            transform = _transforms(data, False, IMAGENET_MEAN, IMAGENET_STD, (height, width))
            return _Transformed(held_out, None, transform, log if data.max_corrupt_fraction > 0 else None)
        transform = _transforms(data, False, CIFAR_MEAN, CIFAR_STD, (height, width))
        return _Transformed(cifar(self.data_root, data)[1], None, transform)


class ImageClassification(PatchTask):
    DataModule = ImageDataModule
    DataConfig = ImageDataConfig
    data: ImageDataConfig

    def geometry(self) -> Geometry:
        return image_geometry((self.data.image_size, self.data.image_size), self.config.model.patch_size)

    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        return ViT(make_encoding, self.geometry(), self.config.model, self.data.channels, self.data.num_classes)

    def __init__(self, config: RunConfig, data_root: Path | None = None) -> None:
        super().__init__(config, data_root)
        patch, where = config.model.patch_size, f"{config.task}/{config.profile}"
        size = self.data.image_size
        if size % patch:  # the patch embedding would drop pixels (and positions would not match)
            fits = [s for s in (size // patch * patch, (size // patch + 1) * patch) if s > 0]
            raise ConfigError(
                f"{where}: data.image_size={size} is not divisible by model.patch_size={patch}; "
                f"use e.g. {' or '.join(map(str, fits))}"
            )
        if self.data.held_out_pairs and self.data.source != "synthetic":
            raise ConfigError(
                f"{where}: data.held_out_pairs holds generated placements out of training and needs "
                f"data.source=synthetic, not {self.data.source!r}; drop the option for a real dataset"
            )
        if self.data.source == "synthetic":
            d = self.data
            per_image = {
                "data.hflip": d.hflip,
                "data.randaugment": d.randaugment,
                "data.random_resized_crop": d.random_resized_crop,
            }
            refuse_ignored_augmentations(per_image, d.source, where)
        if self.data.held_out_pairs:  # a rescaled batch puts the markers on other patch cells
            refuse_moving_augmentations("data.held_out_pairs", {"data.train_sides": bool(self.data.train_sides)}, where)
        if self.data.fresh_train_images and self.data.source != "synthetic":
            raise ConfigError(
                f"{where}: data.fresh_train_images generates new relation images every epoch and needs "
                f"data.source=synthetic, not {self.data.source!r}; drop the option for a real dataset"
            )
        check_sides(self.data.train_sides, patch, f"{where}: data.train_sides")
        if self.data.tta_delta:
            sides = ResizeTTA(self.data.tta_delta).sides(self.data.image_size)
            check_sides(sides, patch, f"{where}: data.tta_delta (image_size -/+ tta_delta)")

    def lightning_module(self, model: nn.Module) -> ClassificationModule:
        data = self.data
        resolution = RandomBatchResolution(data.train_sides) if data.train_sides else None
        tta = ResizeTTA(data.tta_delta) if data.tta_delta else None
        mix = self._mix()
        # Resolution first, so MixUp/CutMix mix images of one size.
        transform = ComposeBatch(resolution, mix) if resolution or mix else None
        return ClassificationModule(model, data.num_classes, self.config.optim, transform, tta)

    def _mix(self) -> nn.Module | None:
        from torchvision.transforms import v2

        choices = []
        if self.data.mixup_alpha > 0:
            choices.append(v2.MixUp(alpha=self.data.mixup_alpha, num_classes=self.data.num_classes))
        if self.data.cutmix_alpha > 0:
            choices.append(v2.CutMix(alpha=self.data.cutmix_alpha, num_classes=self.data.num_classes))
        return v2.RandomChoice(choices) if choices else None

    def check_data(self, full: bool = False, workers: int = 1) -> DataReport:
        data, report = self.data, DataReport(self.name)
        if data.source == "imagefolder":
            root = readers.imagefolder_root(self.data_root, data.dataset_dir)
            classes = readers.imagefolder_classes(root, data.num_classes)
            report.notes.append(f"{len(classes)} classes, the same in {root / 'train'} and {root / 'val'}")
            if full:
                files = readers.imagefolder_files(root, classes)
                report.checked = len(files)
                report.broken = scan_files(files, readers.check_image_file, workers)
        elif data.source in ("cifar10", "cifar100"):
            folder = readers.cifar_folder(self.data_root, data.dataset_dir, data.source)
            names = readers.cifar_class_names(folder, data.source, data.num_classes)
            report.notes.append(f"{len(names)} classes in {folder}")
            if full:
                _, train, test, *_ = readers.CIFAR_RELEASE[data.source]
                files = [(folder / name, data.source, data.num_classes) for name in (*train, *test)]
                report.checked = len(files)
                report.broken = scan_files(files, readers.check_cifar_file, workers)
                if not report.broken:  # every class has images in both splits
                    readers.cifar_release(folder, data.source, data.num_classes)
        else:
            report.notes.append("generated data: nothing on disk to check")
        return report


_STANDIN = "generated relation images (direction from an anchor patch to a target patch, {n} sectors)"


class ImageNet(ImageClassification):
    name = "imagenet"
    tiny_standin = _STANDIN.format(n=8)


class Cifar10(ImageClassification):
    name = "cifar10"
    tiny_standin = _STANDIN.format(n=10)


class Cifar100(ImageClassification):
    name = "cifar100"
    tiny_standin = _STANDIN.format(n=12)
