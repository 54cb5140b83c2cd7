"""Video classification with ViViT: ``ucf101`` (PaPE Table 1, UCF101 column).

``paper`` reads UCF101 in its official layout (:mod:`.video_ucf101`); ``tiny`` uses the
generated motion clips of :mod:`.video_synthetic`. The three official folds are three
runs: with ``fold: seed`` (the default) seed s trains and tests fold s % 3 + 1, so
``--seeds 0,1,2`` reports the mean over the folds, as the paper does.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn
from torch.utils.data import Dataset

from pe_bench.adapters import EncodingFactory, Geometry
from pe_bench.harness.config import RunConfig, Strict
from pe_bench.harness.data import PatchDataModule

from .._shared.data_checks import DataReport, refuse_ignored_augmentations, scan_files, share_seen
from .._shared.motion import MOTIONS, check_held_out_paths, split_paths
from ..base import PatchTask
from .synthetic import motion_clips_with_paths
from .ucf101 import check_video, read_tubelet_frames, ucf101_root, ucf101_splits
from .vivit import VideoBatch, ViViT, video_geometry

KINETICS_MEAN = (0.45, 0.45, 0.45)
KINETICS_STD = (0.225, 0.225, 0.225)


class VideoDataConfig(Strict):
    source: Literal["synthetic", "ucf101"]
    num_classes: int
    image_height: int
    image_width: int
    tubelet: int = 2  # frames per tubelet ("2-tubelets")
    max_samples: int = 5  # tubelets in time per video
    # ucf101 only
    dataset_dir: str = "ucf101"
    frame_step: int = 10  # frames between consecutive tubelets
    fold: int | Literal["seed"] = "seed"
    randaugment: bool = False
    hflip: bool = False
    # synthetic only
    train_size: int = 0
    val_size: int = 0
    test_size: int = 0
    noise: float = 0.1
    # A fraction of every motion class's disk paths (the cells it visits, in order) that
    # training and validation never show; the test split holds only those (motion.split_paths).
    # With 0 (the default) every test clip's path is also a training clip's, so a lookup of
    # paths scores as the motion does. Needs at least 2 paths per class: not on the tiny 3x3
    # grid, whose diagonal classes have one path each (use data.image_height/width 20: 5x5).
    held_out_paths: float = Field(0.0, ge=0.0, lt=1.0)


def collate_videos(items: list[tuple[Tensor, int, int]]) -> tuple[VideoBatch, Tensor]:
    videos, labels, steps = zip(*items, strict=True)
    batch = VideoBatch(torch.stack(videos), torch.tensor(steps))
    return batch, torch.tensor(labels)


class _Clips(Dataset):
    def __init__(self, clips: Tensor, labels: Tensor, steps: int) -> None:
        self.clips, self.labels, self.steps = clips, labels, steps

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, int, int]:
        return self.clips[i], int(self.labels[i]), self.steps


def held_out_split(data: VideoDataConfig, patch: int) -> tuple[frozenset, frozenset] | tuple[None, None]:
    """(seen, unseen) disk paths of ``data.held_out_paths`` (None, None without it)."""
    if not data.held_out_paths:
        return None, None
    return split_paths(data.num_classes, data.image_height // patch, data.max_samples, data.held_out_paths)


@lru_cache(maxsize=4)
def _synthetic(data: tuple, patch: int) -> tuple[dict[str, _Clips], float]:
    """The generated splits and the share of test clips whose disk path training shows."""
    config = VideoDataConfig(**dict(data))
    grid = config.image_height // patch
    seen, unseen = held_out_split(config, patch)
    splits, paths = {}, {}
    # Fixed data seeds per split: every method and seed sees the same clips.
    for offset, (name, count) in enumerate(
        (("train", config.train_size), ("val", config.val_size), ("test", config.test_size))
    ):
        x, y, paths[name] = motion_clips_with_paths(
            count, config.num_classes, grid, patch, config.max_samples, config.tubelet, 3, config.noise, 2000 + offset,
            unseen if name == "test" else seen,
        )  # fmt: skip
        splits[name] = _Clips(x, y, config.max_samples)
    return splits, share_seen(paths["train"], paths["test"])


class UCF101Clips(Dataset):
    """Official-layout videos -> (C, T, H, W) float clips zero-padded to ``max_samples`` tubelets."""

    def __init__(self, items: list[tuple[Path, int]], data: VideoDataConfig, train: bool) -> None:
        from torchvision.transforms import v2

        self.items, self.data = items, data
        size = (data.image_height, data.image_width)
        steps: list[Any] = []
        if train and data.hflip:
            steps.append(v2.RandomHorizontalFlip())
        if train and data.randaugment:
            steps.append(v2.RandAugment())
        steps.append(v2.Resize(size, antialias=True))
        # v2 transforms treat the leading T as a batch: one random draw for the whole clip.
        self.transform = v2.Compose(steps)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Tensor, int, int]:
        path, label = self.items[i]
        data = self.data
        frames = read_tubelet_frames(path, data.tubelet, data.frame_step, data.max_samples)
        frames = self.transform(frames).float() / 255.0
        mean = torch.tensor(KINETICS_MEAN).view(1, 3, 1, 1)
        frames = (frames - mean) / torch.tensor(KINETICS_STD).view(1, 3, 1, 1)
        steps = frames.shape[0] // data.tubelet
        frames = F.pad(frames, (0, 0, 0, 0, 0, 0, 0, data.max_samples * data.tubelet - frames.shape[0]))
        return frames.permute(1, 0, 2, 3), label, steps


def ucf101_fold(data: VideoDataConfig, seed: int) -> int:
    return seed % 3 + 1 if data.fold == "seed" else int(data.fold)


class VideoDataModule(PatchDataModule):
    collate_fn = staticmethod(collate_videos)
    data: VideoDataConfig

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        if self.data.source == "synthetic":
            splits, self.test_paths_seen = _synthetic(tuple(sorted(self.data.model_dump().items())), self.patch)
            self.splits = dict(splits)
            return
        fold = ucf101_fold(self.data, self.seed)
        root = ucf101_root(Path(self.data_root or ".") / self.data.dataset_dir, fold)
        items = ucf101_splits(root, fold, self.data.num_classes)
        self.splits = {name: UCF101Clips(items[name], self.data, name == "train") for name in items}

    def extra_results(self) -> dict[str, float]:
        """With ``data.held_out_paths``, the share of test clips whose disk path training showed
        (measured on the splits, 0 when the hold-out works)."""
        if self.data.source != "synthetic" or not self.data.held_out_paths:
            return {}
        self.setup()
        return {"test_paths_seen_in_training": self.test_paths_seen}


class UCF101(PatchTask):
    DataModule = VideoDataModule
    name = "ucf101"
    DataConfig = VideoDataConfig
    data: VideoDataConfig
    tiny_standin = "generated motion clips on a 3x3 patch grid (direction and rotation sense; 8 classes)"

    def __init__(self, config: RunConfig, data_root: Path | None = None) -> None:
        super().__init__(config, data_root)
        d = self.data
        grid = d.image_height // config.model.patch_size
        where = f"{config.task}/{config.profile}"
        check_held_out_paths(d.held_out_paths, d.source == "synthetic", d.num_classes, grid, d.max_samples, where)
        if d.source == "synthetic":
            refuse_ignored_augmentations({"data.hflip": d.hflip, "data.randaugment": d.randaugment}, d.source, where)

    def class_names(self) -> list[str] | None:
        """The generated motions' names (the real dataset's are not read here)."""
        return list(MOTIONS[: self.data.num_classes]) if self.data.source == "synthetic" else None

    def geometry(self) -> Geometry:
        d = self.data
        size = (d.image_height, d.image_width)
        return video_geometry(d.max_samples * d.tubelet, size, d.tubelet, self.config.model.patch_size)

    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        d = self.data
        return ViViT(make_encoding, self.geometry(), self.config.model, d.tubelet, 3, d.num_classes)

    def check_data(self, full: bool = False, workers: int = 1) -> DataReport:
        d, report = self.data, DataReport(self.name)
        if d.source != "ucf101":
            report.notes.append("generated data: nothing on disk to check")
            return report
        videos: set[Path] = set()
        for fold in (1, 2, 3) if d.fold == "seed" else (int(d.fold),):
            root = ucf101_root(Path(self.data_root or ".") / d.dataset_dir, fold)
            splits = ucf101_splits(root, fold, d.num_classes)
            videos |= {path for items in splits.values() for path, _ in items}
            report.notes.append(f"fold {fold}: {d.num_classes} classes in both lists; " + ", ".join(
                f"{len(items)} {split}" for split, items in splits.items()
            ))  # fmt: skip
        if full:
            items = [(path, d.tubelet, d.frame_step, d.max_samples) for path in sorted(videos)]
            report.checked, report.broken = len(items), scan_files(items, check_video, workers)
        return report
