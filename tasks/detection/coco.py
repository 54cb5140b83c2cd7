"""COCO 2017 detection data: the official layout, images with their boxes, augmentations.

Layout under ``--data-root`` (``dataset_dir`` = coco)::

    coco/train2017/*.jpg                          118,287 training images
    coco/val2017/*.jpg                            5,000 validation images (our test split)
    coco/annotations/instances_train2017.json     boxes as [x, y, w, h] in pixels
    coco/annotations/instances_val2017.json

As for ImageNet, the official validation split is the test set and a fixed fraction of the
training images is held out for validation (checkpoint selection). Category ids (1-90 with
gaps) map to class indices 0-79 in id order. Crowd boxes are not trained on and are marked
``iscrowd`` for the evaluation, which then neither rewards nor penalises detections on them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from pe_bench.harness.data import DatasetMissingError
from pe_bench.tasks._shared.data_checks import MalformedDatasetError

SPLITS = {"train": "train2017", "val": "val2017"}
SOURCE = "https://cocodataset.org/#download (2017 Train/Val images, 2017 Train/Val annotations)"


def coco_root(root: Path) -> Path:
    """``root`` if it has the COCO 2017 layout, else a :class:`DatasetMissingError`."""
    expected = [root / folder for folder in SPLITS.values()]
    expected += [root / "annotations" / f"instances_{folder}.json" for folder in SPLITS.values()]
    missing = [str(path) for path in expected if not path.exists()]
    if missing:
        raise DatasetMissingError(
            f"COCO 2017 not found: {', '.join(missing)} missing.\n"
            f"Expected layout under {root}:\n"
            "  train2017/*.jpg   val2017/*.jpg\n"
            "  annotations/instances_train2017.json   annotations/instances_val2017.json\n"
            f"Source: {SOURCE}. pe-bench never downloads it."
        )
    return root


class CocoImages:
    """The images and boxes of one split's annotation file (without pycocotools: plain JSON)."""

    def __init__(self, root: Path, folder: str) -> None:
        path = root / "annotations" / f"instances_{folder}.json"
        try:
            payload = json.loads(path.read_text())
            images, annotations, categories = payload["images"], payload["annotations"], payload["categories"]
        except (json.JSONDecodeError, KeyError) as err:
            raise DatasetMissingError(f"{path}: not a COCO instances file ({type(err).__name__}: {err})") from None
        self.image_dir = root / folder
        self.category_ids = sorted(c["id"] for c in categories)
        self.class_names = [c["name"] for c in sorted(categories, key=lambda c: c["id"])]
        index = {category: i for i, category in enumerate(self.category_ids)}
        per_image = defaultdict(list)
        for a in annotations:
            per_image[a["image_id"]].append(a)
        self.images = sorted(images, key=lambda image: image["id"])
        self.boxes, self.labels, self.crowd = [], [], []
        for image in self.images:
            found = [a for a in per_image[image["id"]] if a["bbox"][2] > 0 and a["bbox"][3] > 0]
            xywh = np.array([a["bbox"] for a in found], dtype=np.float32).reshape(-1, 4)
            self.boxes.append(np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1))
            self.labels.append(np.array([index[a["category_id"]] for a in found], dtype=np.int64))
            self.crowd.append(np.array([bool(a.get("iscrowd", 0)) for a in found], dtype=bool))

    def __len__(self) -> int:
        return len(self.images)

    def load(self, i: int) -> tuple[Tensor, dict[str, Tensor]]:
        """(3, H, W) uint8 image and its target: boxes (x1, y1, x2, y2), labels, iscrowd."""
        from PIL import Image

        with Image.open(self.image_dir / self.images[i]["file_name"]) as file:
            image = torch.from_numpy(np.array(file.convert("RGB"))).permute(2, 0, 1).contiguous()
        target = {
            "boxes": torch.from_numpy(self.boxes[i]),
            "labels": torch.from_numpy(self.labels[i]),
            "iscrowd": torch.from_numpy(self.crowd[i]),
        }
        return image, target


def check_categories(splits: list[CocoImages], num_classes: int) -> None:
    """Every annotation file has ``num_classes`` categories, else an error naming the files."""
    wrong = [f"{split.image_dir.name}: {len(split.category_ids)}" for split in splits]
    if any(len(split.category_ids) != num_classes for split in splits):
        raise MalformedDatasetError(
            f"coco: data.num_classes is {num_classes}, but the annotation files have other category counts "
            f"({', '.join(wrong)}): set data.num_classes to the annotation files' count"
        )
    same_categories(splits)


def same_categories(splits: list[CocoImages]) -> None:
    """Every annotation file lists the same category ids: each file maps its sorted ids to
    labels 0..C-1 itself, so with other ids one label would name two classes across splits
    (a model trained on one category scored against another), silently."""
    first = splits[0]
    for split in splits[1:]:
        if split.category_ids != first.category_ids:
            only = sorted(set(first.category_ids) ^ set(split.category_ids))
            raise MalformedDatasetError(
                f"coco: the annotation files of {first.image_dir.name} and {split.image_dir.name} list other "
                f"category ids (in one only: {only[:10]}): labels would name other classes in each; "
                "use annotation files with one category list"
            )


class PhotometricRandAugment:
    """RandAugment (Cubuk et al., 2020) without its geometric operations, on the image only.

    PaPE drops shear and rotation on COCO because they corrupt boxes; torchvision's RandAugment
    cannot move boxes at all, so translation goes too (large-scale jitter already translates).
    """

    def __init__(self) -> None:
        from torchvision.transforms import v2

        geometric = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}

        class _Photometric(v2.RandAugment):
            _AUGMENTATION_SPACE = {k: v for k, v in v2.RandAugment._AUGMENTATION_SPACE.items() if k not in geometric}

        self.transform = _Photometric()

    def __call__(self, image: Tensor) -> Tensor:
        return self.transform(image)


def letterbox(image: Tensor, boxes: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Scale the longer side to ``size`` and pad right/bottom with zeros to size x size."""
    import torch.nn.functional as F
    from torchvision.transforms.v2 import functional as TF

    h, w = image.shape[-2:]
    scale = size / max(h, w)
    if scale != 1.0:
        new = (max(1, round(h * scale)), max(1, round(w * scale)))
        image = TF.resize(image, list(new), antialias=True)
        boxes = boxes * torch.tensor([new[1] / w, new[0] / h] * 2)
    pad_h, pad_w = size - image.shape[-2], size - image.shape[-1]
    return F.pad(image, (0, pad_w, 0, pad_h)), boxes


class LargeScaleJitter:
    """Ghiasi et al. (2021, arXiv:2012.07177) as ViTDet trains: random horizontal flip, resize
    by a factor in [0.1, 2.0] of the ``size`` x ``size`` target, random crop or pad to it; boxes
    follow and those cut to nothing are dropped."""

    def __init__(self, size: int, scale_range: tuple[float, float] = (0.1, 2.0)) -> None:
        from torchvision.transforms import v2

        self.transform = v2.Compose(
            [
                v2.RandomHorizontalFlip(),
                v2.ScaleJitter((size, size), scale_range, antialias=True),
                v2.RandomCrop(size, pad_if_needed=True),
                v2.SanitizeBoundingBoxes(min_size=1.0),
            ]
        )

    def __call__(self, image: Tensor, target: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        from torchvision import tv_tensors

        boxes = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=tuple(image.shape[-2:]))
        out_image, out = self.transform(tv_tensors.Image(image), {**target, "boxes": boxes})
        return out_image.as_subclass(Tensor), {k: v.as_subclass(Tensor) for k, v in out.items()}


class CocoDetection(Dataset):
    """Images of ``source`` (optionally a subset), as normalised (3, size, size) tensors with
    boxes in that frame. Training adds large-scale jitter and/or photometric RandAugment."""

    MEAN = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    STD = torch.tensor([0.229, 0.224, 0.225])[:, None, None]

    def __init__(
        self,
        source: CocoImages,
        indices: np.ndarray | None,
        size: int,
        jitter: bool = False,
        randaugment: bool = False,
        drop_crowd: bool = False,
    ) -> None:
        self.source, self.size = source, size
        self.indices = np.arange(len(source)) if indices is None else indices
        self.jitter = LargeScaleJitter(size) if jitter else None
        self.randaugment = PhotometricRandAugment() if randaugment else None
        self.drop_crowd = drop_crowd

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Tensor, dict[str, Tensor]]:
        image, target = self.source.load(int(self.indices[i]))
        if self.drop_crowd:  # training never learns from crowd regions
            keep = ~target["iscrowd"]
            target = {k: v[keep] for k, v in target.items()}
        if self.jitter is not None:
            image, target = self.jitter(image, target)
        image, boxes = letterbox(image, target["boxes"], self.size)
        if self.randaugment is not None:
            image = self.randaugment(image)
        image = (image.float() / 255.0 - self.MEAN) / self.STD
        return image, {**target, "boxes": boxes.float()}


def collate_images(items: list[tuple[Tensor, dict[str, Tensor]]]) -> tuple[Tensor, list[dict[str, Any]]]:
    return torch.stack([image for image, _ in items]), [target for _, target in items]
