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
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from pe_bench.adapters import EncodingFactory, Geometry
from pe_bench.harness.config import RunConfig, Strict
from pe_bench.harness.data import DatasetMissingError, PatchDataModule, stratified_split
from pe_bench.harness.module import ClassificationModule
from pe_bench.tasks._shared.vit import ViT, image_geometry

from ..base import PatchTask
from .resolution import ComposeBatch, RandomBatchResolution, ResizeTTA, check_sides
from .synthetic import relation_images

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class ImageDataConfig(Strict):
    source: Literal["synthetic", "imagefolder", "cifar10", "cifar100"]
    image_size: int
    num_classes: int
    channels: int = 3
    dataset_dir: str = ""  # under --data-root
    val_fraction: float = 0.01  # stratified hold-out of the training split (PaPE App. E: 1%)
    # synthetic only
    train_size: int = 0
    val_size: int = 0
    test_size: int = 0
    distractors: int = 2
    noise: float = 0.15
    # augmentation (paper profiles)
    randaugment: bool = False
    hflip: bool = False
    random_resized_crop: bool = False
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    # UniViT (CAPE §5.1.2): every training batch resized to a side drawn from this list
    # (the paper: [128, 160, ..., 320]); empty trains at image_size only.
    train_sides: list[int] = []
    # Resize test-time augmentation (CAPE §5.1.3): mean logits at image_size -/+ this many
    # pixels and at image_size itself (the paper: 32); 0 is off.
    tta_delta: int = 0


@lru_cache(maxsize=8)
def _synthetic_splits(
    num_classes: int, image_size: int, patch: int, channels: int, sizes: tuple[int, int, int], distractors: int,
    noise: float,
) -> tuple[TensorDataset, TensorDataset, TensorDataset]:  # fmt: skip
    grid = (image_size // patch, image_size // patch)
    splits = []
    # Fixed data seeds per split: every run of every method sees the same data.
    for offset, count in enumerate(sizes):
        x, y = relation_images(count, num_classes, grid, patch, channels, distractors, noise, seed=1000 + offset)
        splits.append(TensorDataset(x, y))
    return tuple(splits)  # type: ignore[return-value]


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
    """A subset of a dataset with its own transform (train and val share files)."""

    def __init__(self, base: Dataset, indices: np.ndarray | None, transform: Any) -> None:
        self.base = base if indices is None else Subset(base, indices.tolist())
        self.transform = transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.base[i]
        return self.transform(image), label


def imagefolder_root(data_root: Path | None, data: ImageDataConfig) -> Path:
    root = Path(data_root or ".") / data.dataset_dir
    problems = [f"{root / split} is missing" for split in ("train", "val") if not (root / split).is_dir()]
    if not problems:
        empty = [s for s in ("train", "val") if not any(p.is_dir() for p in (root / s).iterdir())]
        problems = [f"{root / s} has no class folders" for s in empty]
    if problems:
        raise DatasetMissingError(
            f"ImageNet-1K not found: {'; '.join(problems)}.\n"
            f"Expected layout under --data-root ({data_root}):\n"
            f"  {data.dataset_dir}/train/<wnid>/*.JPEG   (the 1000 class folders of ILSVRC2012 train)\n"
            f"  {data.dataset_dir}/val/<wnid>/*.JPEG     (the official validation set sorted into the same\n"
            f"                                   class folders, e.g. with the usual valprep.sh)\n"
            "Source: https://image-net.org/download (ILSVRC2012). pe-bench never downloads it."
        )
    return root


def cifar_root(data_root: Path | None, data: ImageDataConfig) -> Path:
    folder = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}[data.source]
    root = Path(data_root or ".") / data.dataset_dir
    if not (root / folder).is_dir():
        url = {"cifar10": "cifar-10-python.tar.gz", "cifar100": "cifar-100-python.tar.gz"}[data.source]
        raise DatasetMissingError(
            f"{data.source.upper()} not found: {root / folder} is missing.\n"
            f"Expected layout under --data-root ({data_root}): {data.dataset_dir}/{folder}/ "
            f"(the extracted python version).\nSource: https://www.cs.toronto.edu/~kriz/{url}"
        )
    return root


class ImageDataModule(PatchDataModule):
    data: ImageDataConfig

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        data = self.data
        if data.source == "synthetic":
            sizes = (data.train_size, data.val_size, data.test_size)
            train, val, test = _synthetic_splits(
                data.num_classes, data.image_size, self.patch, data.channels, sizes, data.distractors, data.noise
            )
        elif data.source == "imagefolder":
            from torchvision.datasets import ImageFolder

            root = imagefolder_root(self.data_root, data)
            full = ImageFolder(str(root / "train"))
            train_idx, val_idx = stratified_split(np.asarray(full.targets), data.val_fraction)
            train_tf, eval_tf = (_transforms(data, t, IMAGENET_MEAN, IMAGENET_STD) for t in (True, False))
            train = _Transformed(full, train_idx, train_tf)
            val = _Transformed(full, val_idx, eval_tf)
            test = _Transformed(ImageFolder(str(root / "val")), None, eval_tf)
        else:
            from torchvision.datasets import CIFAR10, CIFAR100

            cls = CIFAR10 if data.source == "cifar10" else CIFAR100
            root = str(cifar_root(self.data_root, data))
            full = cls(root, train=True, download=False)
            mean, std = CIFAR_MEAN, CIFAR_STD
            train_idx, val_idx = stratified_split(np.asarray(full.targets), data.val_fraction)
            train = _Transformed(full, train_idx, _transforms(data, True, mean, std))
            val = _Transformed(full, val_idx, _transforms(data, False, mean, std))
            test = _Transformed(cls(root, train=False, download=False), None, _transforms(data, False, mean, std))
        self.splits = {"train": train, "val": val, "test": test}

    def test_set_at(self, height: int, width: int) -> Dataset:
        """The test split at another resolution, for extrapolation (PaPE Appendix B). Synthetic
        data is regenerated on the larger patch grid (a bigger image holds more patches)."""
        data = self.data
        if data.source == "synthetic":
            grid = (height // self.patch, width // self.patch)
            x, y = relation_images(
                data.test_size, data.num_classes, grid, self.patch, data.channels, data.distractors, data.noise,
                seed=5000 + 97 * height + width,
            )  # fmt: skip
            return TensorDataset(x, y)
        if data.source == "imagefolder":
            from torchvision.datasets import ImageFolder

            root = imagefolder_root(self.data_root, data)
            transform = _transforms(data, False, IMAGENET_MEAN, IMAGENET_STD, (height, width))
            return _Transformed(ImageFolder(str(root / "val")), None, transform)
        from torchvision.datasets import CIFAR10, CIFAR100

        cls = CIFAR10 if data.source == "cifar10" else CIFAR100
        transform = _transforms(data, False, CIFAR_MEAN, CIFAR_STD, (height, width))
        return _Transformed(cls(str(cifar_root(self.data_root, data)), train=False, download=False), None, transform)


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

    def check_data(self) -> None:
        if self.data.source == "imagefolder":
            imagefolder_root(self.data_root, self.data)
        elif self.data.source in ("cifar10", "cifar100"):
            cifar_root(self.data_root, self.data)


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
