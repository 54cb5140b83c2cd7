"""Models (backbone + head) and Lightning modules for point-cloud classification and segmentation."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

from pe_bench.harness.config import OptimConfig
from pe_bench.harness.module import TaskModule

from .ptv3 import PointBatch, PTv3

IGNORE_INDEX = -1


def _points(batch: dict) -> PointBatch:
    return PointBatch(batch["coord"], batch["grid_coord"], batch["batch"], batch["feat"])


class PointClassifier(nn.Module):
    """PTv3 encoder, mean over each sample's points, Pointcept's DefaultClassifier head."""

    def __init__(self, backbone: PTv3, num_classes: int, hidden: tuple[int, int] = (256, 128)) -> None:
        super().__init__()
        self.backbone = backbone
        c = backbone.out_channels
        self.head = nn.Sequential(
            nn.Linear(c, hidden[0]), nn.BatchNorm1d(hidden[0]), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(hidden[0], hidden[1]), nn.BatchNorm1d(hidden[1]), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(hidden[1], num_classes),
        )  # fmt: skip

    def forward(self, batch: dict) -> Tensor:
        return self.head(self.backbone(_points(batch)))


class PointSegmenter(nn.Module):
    """PTv3 U-Net and a linear per-point head (Pointcept's DefaultSegmentorV2)."""

    def __init__(self, backbone: PTv3, num_classes: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.out_channels, num_classes)

    def forward(self, batch: dict) -> Tensor:
        return self.head(self.backbone(_points(batch)))


def mean_iou(num_classes: int) -> MulticlassJaccardIndex:
    """mIoU over the classes present in prediction or target (a class absent from both in the
    evaluated scenes does not count): torchmetrics' macro average gives such classes weight 0,
    and drops points labelled ``IGNORE_INDEX``. Pointcept's tester averages all classes, an
    absent one as IoU 0; on ScanNet's validation split every one of the 20 classes occurs, so
    the two agree there, and differ only on splits that lack a class (small generated ones)."""
    return MulticlassJaccardIndex(num_classes, average="macro", ignore_index=IGNORE_INDEX)


class PointClassificationModule(TaskModule):
    """Overall accuracy (``acc``, the table metric) and mean class accuracy (``macc``)."""

    def __init__(self, model: nn.Module, num_classes: int, optim: OptimConfig) -> None:
        super().__init__(model, optim)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_macc = MulticlassAccuracy(num_classes, average="macro")
        self.test_macc = MulticlassAccuracy(num_classes, average="macro")

    def training_loss(self, batch: dict) -> Tensor:
        logits = self.model(batch)
        return F.cross_entropy(logits.float(), batch["label"], label_smoothing=self.optim.label_smoothing)

    def batch_size_of(self, batch: dict) -> int:
        return len(batch["label"])

    def _eval(self, batch: dict, split: str) -> None:
        logits, labels = self.model(batch), batch["label"]
        acc, macc = getattr(self, f"{split}_acc"), getattr(self, f"{split}_macc")
        acc(logits, labels)
        macc(logits, labels)
        self.log(f"{split}/acc", acc, prog_bar=split == "val", on_epoch=True, batch_size=len(labels))
        self.log(f"{split}/macc", macc, on_epoch=True, batch_size=len(labels))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval(batch, "test")


class PointSegmentationModule(TaskModule):
    """Cross-entropy with ignore index; ``miou`` the table metric, point accuracy beside it."""

    def __init__(self, model: nn.Module, num_classes: int, optim: OptimConfig) -> None:
        super().__init__(model, optim)
        self.val_miou, self.test_miou = mean_iou(num_classes), mean_iou(num_classes)

    def training_loss(self, batch: dict) -> Tensor:
        logits = self.model(batch)
        return F.cross_entropy(logits.float(), batch["segment"], ignore_index=IGNORE_INDEX)

    def batch_size_of(self, batch: dict) -> int:
        return 1  # every step weighs the same in the epoch mean, however many scenes it holds

    def _eval(self, batch: dict, split: str) -> None:
        metric = getattr(self, f"{split}_miou")
        predicted, target = self.model(batch).argmax(-1), batch["segment"]
        if "inverse" in batch:
            # Every point of the scene, labelled by its voxel's prediction (Pointcept's evaluator):
            # scoring the kept points only would weigh each voxel once, however many points it holds.
            predicted, target = predicted[batch["inverse"]], batch["origin_segment"]
        metric(predicted, target)
        self.log(f"{split}/miou", metric, prog_bar=split == "val", on_epoch=True, batch_size=1)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval(batch, "test")
