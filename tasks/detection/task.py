"""Object detection: ``coco`` (ViT on images) and ``gen1`` (event ViT on Spiking Patches
tokens), both with ViTDet's simple feature pyramid and a YOLOv10-style head (PaPE Table 1).

``paper`` profiles read COCO 2017 (:mod:`.coco`) and the Prophesee GEN1 release
(:mod:`.gen1`) from ``--data-root``; ``tiny`` profiles generate their data: relation scenes
written in the COCO layout (:mod:`.synthetic`) and emulated event streams of flashing boxes
(:mod:`.event_scenes`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Literal

import lightning as L
import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor, nn
from torch.utils.data import Dataset, get_worker_info

from pe_bench.adapters import EncodingFactory, Geometry
from pe_bench.harness.config import ConfigError, RunConfig, Strict
from pe_bench.harness.data import SplitDataModule, package_version
from pe_bench.tasks._shared.data_checks import DataReport, refuse_moving_augmentations, scan_files
from pe_bench.tasks._shared.spiking_patches import EventBatch, EventTokens, SpikingPatches, pad_tokens
from pe_bench.tasks._shared.spiking_patches_data import SpikingPatchesDataModule

from ..base import Task
from ..image.readers import read_image
from .coco import SPLITS, CocoDetection, CocoImages, check_categories, coco_root, collate_images, same_categories
from .event_scenes import flashing_box_streams
from .gen1 import SPLITS as GEN1_SPLITS
from .gen1 import (
    BoxSizeFilter,
    Gen1Augmentation,
    check_recording,
    events_before,
    gen1_root,
    gen1_samples,
    recordings,
)
from .models import (
    EVENT_DETECTION_GEOMETRY,
    DetectionModelConfig,
    EventDetector,
    ImageDetector,
    image_detection_geometry,
)
from .module import DetectionFilter, DetectionModule
from .synthetic import HELD_OUT_FILE, SceneSpec, tiny_coco


def held_out(count: int, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, val): a fixed random ``fraction`` (at least one) held out for validation."""
    order = np.random.default_rng(seed).permutation(count)
    n_val = max(1, round(fraction * count))
    return np.sort(order[n_val:]), np.sort(order[:n_val])


class DetectionTask(Task):
    label_smoothing_applies = False  # its loss has none
    metric = "map"
    metric_label = "mAP"
    score_scale = 100.0
    ModelConfig: ClassVar[type[DetectionModelConfig]] = DetectionModelConfig

    def lightning_module(self, model: nn.Module) -> DetectionModule:
        m = self.config.model
        reg_max, max_detections = m.reg_max, m.max_detections  # type: ignore[attr-defined]
        return DetectionModule(model, self.config.optim, reg_max, max_detections, self.detection_filter())

    def detection_filter(self) -> DetectionFilter | None:
        """The detections the evaluation protocol scores (None: all of them)."""
        return None

    def data_fingerprint(self) -> dict[str, str | None]:
        """The mAP is pycocotools' evaluation (through torchmetrics, whose version env.json has)."""
        return {"pycocotools": package_version("pycocotools")}


class CocoDataConfig(Strict):
    source: Literal["generated", "coco"]
    image_size: int
    num_classes: int
    dataset_dir: str = "coco"  # under --data-root
    val_fraction: float = 0.01  # of train2017, held out for checkpoint selection
    large_scale_jitter: bool = False
    randaugment: bool = False  # photometric operations only (see coco.PhotometricRandAugment)
    # generated only: train_size images in train2017 (val_fraction of them held out), test_size in val2017
    train_size: int = 0
    test_size: int = 0
    objects: tuple[int, int] = (2, 4)  # objects per image, inclusive range
    object_sides: tuple[int, int] = (8, 20)  # box side in pixels, inclusive range
    # The grid the marker sits inside one cell of (pixels); objects keep out of its row and column of
    # cells. Set it to the backbone's patch size (checked), so the relation holds between patches.
    cell: int = 8
    # A fraction of the marker's cells that training and validation never show; the test split's
    # markers sit in those only (synthetic.split_marker_cells). With 0 (the default) 98.5 % of the
    # test objects repeat a training object's (marker cell, centre cell) placement, so a lookup of
    # placements scores as the relation does; held out, no test placement is a training one.
    held_out_marker_cells: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _generated_sizes(self) -> CocoDataConfig:
        if self.source == "generated" and (self.train_size < 2 or self.test_size < 1):
            raise ValueError("generated data needs train_size >= 2 and test_size >= 1")
        return self


class CocoDataModule(SplitDataModule):
    collate_fn = staticmethod(collate_images)

    def __init__(
        self, data: CocoDataConfig, batch_size: int, num_workers: int, seed: int, data_root: Path | None
    ) -> None:
        super().__init__(batch_size, num_workers, seed)
        self.data, self.data_root = data, data_root

    def root(self) -> Path:
        d = self.data
        if d.source == "generated":
            spec = SceneSpec(d.image_size, d.objects, d.object_sides, d.cell)
            return tiny_coco(d.train_size, d.test_size, spec, held_out=d.held_out_marker_cells)
        return coco_root(Path(self.data_root or ".") / d.dataset_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        d, root = self.data, self.root()
        train, test = CocoImages(root, "train2017"), CocoImages(root, "val2017")
        if len(train.category_ids) != d.num_classes:
            raise ConfigError(
                f"data.num_classes is {d.num_classes}, but {root}/annotations/instances_train2017.json has "
                f"{len(train.category_ids)} categories: set data.num_classes to {len(train.category_ids)}"
            )
        same_categories([train, test])
        train_idx, val_idx = held_out(len(train), d.val_fraction)
        self.splits = {
            "train": CocoDetection(
                train, train_idx, d.image_size, d.large_scale_jitter, d.randaugment, drop_crowd=True
            ),
            "val": CocoDetection(train, val_idx, d.image_size),
            "test": CocoDetection(test, None, d.image_size),
        }

    def extra_results(self) -> dict[str, float]:
        """With ``data.held_out_marker_cells``, the share of test objects whose (marker cell, centre
        cell) placement training showed (measured when the scenes were made, 0 when it works)."""
        if self.data.source != "generated" or not self.data.held_out_marker_cells:
            return {}
        overlap = json.loads((self.root() / HELD_OUT_FILE).read_text())
        return {"test_objects_seen_in_training": overlap["test_objects_seen_in_training"]}


class Coco(DetectionTask):
    name = "coco"
    DataConfig = CocoDataConfig
    data: CocoDataConfig
    tiny_standin = "generated shapes on photographs; class = quadrant relative to a marker's patch (4 classes)"

    def __init__(self, config: RunConfig, data_root: Path | None = None) -> None:
        super().__init__(config, data_root)
        patch = config.model.patch_size
        if self.data.held_out_marker_cells:
            where = f"{config.task}/{config.profile}"
            if self.data.source != "generated":
                raise ConfigError(
                    f"{where}: data.held_out_marker_cells holds generated marker cells out of training and needs "
                    f"data.source=generated, not {self.data.source!r}; drop it for a real dataset"
                )
            # jitter rescales and crops (RandAugment here is photometric only)
            jitter = {"data.large_scale_jitter": self.data.large_scale_jitter}
            refuse_moving_augmentations("data.held_out_marker_cells", jitter, where)
        if self.data.source == "generated" and self.data.cell != patch:
            raise ConfigError(
                f"{config.task}/{config.profile}: data.cell ({self.data.cell}) must equal model.patch_size "
                f"({patch}) for the generated scenes, so that the marker's cell is one patch; set both, e.g. "
                f"--set coco:data.cell={patch}"
            )

    def geometry(self) -> Geometry:
        model = self.config.model
        return image_detection_geometry((self.data.image_size,) * 2, model.patch_size, model.register_tokens)  # type: ignore[attr-defined]

    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        return ImageDetector(make_encoding, self.geometry(), self.config.model, 3, self.data.num_classes)  # type: ignore[arg-type]

    def datamodule(self, seed: int) -> L.LightningDataModule:
        optim, trainer = self.config.optim, self.config.trainer
        return CocoDataModule(self.data, optim.batch_size, trainer.num_workers, seed, self.data_root)

    def data_fingerprint(self) -> dict[str, str | None]:
        """Besides the metric's version, the generated scenes' backgrounds are scikit-image's
        sample photographs."""
        fingerprint = super().data_fingerprint()
        if self.data.source == "generated":
            fingerprint["scikit-image"] = package_version("scikit-image")
        return fingerprint

    def check_data(self, full: bool = False, workers: int = 1) -> DataReport:
        """The layout (quick); with ``full``, also the annotation files' categories against
        ``data.num_classes`` and every image they list, decoded in ``workers`` processes."""
        d, report = self.data, DataReport(self.name)
        if d.source != "coco":
            report.notes.append("generated data: nothing on disk to check")
            return report
        root = coco_root(Path(self.data_root or ".") / d.dataset_dir)
        if full:
            splits = [CocoImages(root, folder) for folder in SPLITS.values()]
            check_categories(splits, d.num_classes)
            counts = ", ".join(f"{len(split)} {split.image_dir.name}" for split in splits)
            report.notes.append(f"{d.num_classes} categories; images: {counts}")
            images = [str(split.image_dir / image["file_name"]) for split in splits for image in split.images]
            report.checked, report.broken = len(images), scan_files(images, read_image, workers)
        return report


class Gen1DataConfig(Strict):
    source: Literal["emulated", "gen1"]
    num_classes: int
    width: int
    height: int
    threshold: int = 256  # Spiking Patches sigma: events per token
    refractory_us: int = 100_000  # T
    buckets: int = 10  # log-spaced age buckets per polarity
    time_scale: float = 1e-5  # token time (us) -> position units (PaPE on GEN1: 1/100,000)
    window_events: int = 500_000  # the most recent events before each prediction time
    augment: bool = False  # EventDrop and rotations (training only)
    # gen1 only
    dataset_dir: str = "gen1"
    min_box_diagonal: float = 30.0
    min_box_side: float = 10.0
    skip_us: int = 500_000
    # emulated only
    train_size: int = 0
    val_size: int = 0
    test_size: int = 0
    objects: tuple[int, int] = (1, 2)  # objects per stream, inclusive range
    object_sides: tuple[int, int] = (8, 16)  # long side of a box in pixels, inclusive range
    flashes: tuple[int, int] = (2, 4)  # positions per object, inclusive range
    contrast: float = 0.25  # the emulator's log-intensity threshold


Sample = tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]  # events (x, y, t, p), boxes, labels


class EventDetectionDataset(Dataset):
    """Samples (events, boxes, labels) -> (tokens, target). Without augmentation every sample
    is tokenized once and kept."""

    def __init__(
        self,
        load: Callable[[int], Sample],
        count: int,
        tokenizer: SpikingPatches,
        augmentation: Gen1Augmentation | None = None,
        seed: int = 0,
    ) -> None:
        self.load, self.count, self.tokenizer = load, count, tokenizer
        self.augmentation, self.seed = augmentation, seed
        self.cache: dict[int, tuple[EventTokens, dict[str, Tensor]]] = {}
        self.draws = 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[EventTokens, dict[str, Tensor]]:
        if self.augmentation is None and i in self.cache:
            return self.cache[i]
        events, boxes, labels = self.load(i)
        if self.augmentation is not None:
            worker = get_worker_info()
            self.draws += 1
            rng = np.random.default_rng((self.seed, i, self.draws, worker.id if worker else 0))
            events, boxes, labels = self.augmentation(events, boxes, labels, rng)
        item = (self.tokenizer(*events), {"boxes": torch.from_numpy(boxes), "labels": torch.from_numpy(labels)})
        if self.augmentation is None:
            self.cache[i] = item
        return item


def collate_event_samples(items: list[tuple[EventTokens, dict[str, Tensor]]]) -> tuple[EventBatch, list[dict]]:
    return pad_tokens([tokens for tokens, _ in items]), [target for _, target in items]


@lru_cache(maxsize=4)
def _emulated(count: int, seed: int, size: int, objects: tuple, sides: tuple, flashes: tuple, contrast: float) -> list:
    return flashing_box_streams(
        count, seed, size=size, objects=objects, sides=sides, flashes=flashes, threshold=contrast
    )


class Gen1DataModule(SpikingPatchesDataModule):
    collate_fn = staticmethod(collate_event_samples)
    data: Gen1DataConfig

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        d = self.data
        augmentation = Gen1Augmentation(d.width, d.height) if d.augment else None
        if d.source == "emulated":
            if d.width != d.height:
                raise ConfigError(
                    f"gen1: emulated streams are square: width ({d.width}) must equal height ({d.height})"
                )
            sizes = {"train": d.train_size, "val": d.val_size, "test": d.test_size}
            for offset, (name, count) in enumerate(sizes.items()):
                # Fixed data seeds per split: every method and seed sees the same streams.
                streams = _emulated(count, 9000 + offset, d.width, d.objects, d.object_sides, d.flashes, d.contrast)
                aug = augmentation if name == "train" else None
                self.splits[name] = EventDetectionDataset(streams.__getitem__, count, self.tokenizer(), aug, self.seed)
            return
        root = gen1_root(Path(self.data_root or ".") / d.dataset_dir)
        for name in ("train", "val", "test"):
            samples = gen1_samples(root / name, d.width, d.height, d.min_box_diagonal, d.min_box_side, d.skip_us)

            def load(i: int, samples: list = samples) -> Sample:
                s = samples[i]
                return events_before(s.recording, s.time_us, d.window_events), s.boxes, s.labels

            aug = augmentation if name == "train" else None
            self.splits[name] = EventDetectionDataset(load, len(samples), self.tokenizer(), aug, self.seed)


class Gen1(DetectionTask):
    name = "gen1"
    DataConfig = Gen1DataConfig
    data: Gen1DataConfig
    tiny_standin = "emulated event streams of boxes in apparent motion; label: each box at its last position"

    def geometry(self) -> Geometry:
        return EVENT_DETECTION_GEOMETRY

    def grid(self) -> tuple[int, int]:
        patch = self.config.model.patch_size
        return -(-self.data.height // patch), -(-self.data.width // patch)

    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        d, patch = self.data, self.config.model.patch_size
        shape = (2, d.buckets, patch, patch)
        return EventDetector(
            make_encoding,
            self.geometry(),
            self.config.model,
            shape,
            self.grid(),
            d.time_scale,
            d.num_classes,
        )

    def datamodule(self, seed: int) -> L.LightningDataModule:
        optim, trainer = self.config.optim, self.config.trainer
        return Gen1DataModule(
            self.data, self.config.model.patch_size, optim.batch_size, trainer.num_workers, seed, self.data_root
        )

    def detection_filter(self) -> DetectionFilter | None:
        """On the GEN1 release, Prophesee's box-size rule, which already filters the ground truth
        (:func:`.gen1.gen1_samples`). The emulated streams filter nothing, so they score every detection."""
        d = self.data
        return BoxSizeFilter(d.min_box_diagonal, d.min_box_side).keep if d.source == "gen1" else None

    def check_data(self, full: bool = False, workers: int = 1) -> DataReport:
        """The layout (quick); with ``full``, also every recording's DAT and box files."""
        d, report = self.data, DataReport(self.name)
        if d.source != "gen1":
            report.notes.append("emulated data: nothing on disk to check")
            return report
        root = gen1_root(Path(self.data_root or ".") / d.dataset_dir)
        files = {split: recordings(root / split) for split in GEN1_SPLITS}
        report.notes.append("recordings: " + ", ".join(f"{len(found)} {split}" for split, found in files.items()))
        if full:
            items = [events_file for found in files.values() for events_file in found]
            report.checked = 2 * len(items)  # a DAT file and its box file per recording
            report.broken = scan_files(items, check_recording, workers)
        return report
