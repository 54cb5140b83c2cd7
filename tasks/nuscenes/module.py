"""The Lightning module of the nuScenes task: detection loss in training, mAP in evaluation."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from pe_bench.harness.config import OptimConfig
from pe_bench.harness.module import TaskModule

from .detector import UniTRDetector
from .metric import CentreDistanceMAP


class DetectionModule(TaskModule):
    """``train/loss``; ``val/map`` and ``test/map`` (centre-distance mAP, a fraction); the test's
    AP per class (mean over the distance thresholds, %) as extra results."""

    def __init__(self, model: UniTRDetector, class_names: list[str], optim: OptimConfig) -> None:
        super().__init__(model, optim)
        self.class_names = list(class_names)
        self.val_map = CentreDistanceMAP(len(class_names))
        self.test_map = CentreDistanceMAP(len(class_names))
        self._test_ap: dict[str, float] = {}

    def training_loss(self, batch: dict) -> Tensor:
        return self.model.loss(batch)

    def batch_size_of(self, batch: dict) -> int:
        return len(batch["boxes"])

    def _eval(self, batch: dict, split: str) -> None:
        detections = self.model.detect(batch)
        targets = [{"centres": b[:, :2], "labels": y} for b, y in zip(batch["boxes"], batch["labels"], strict=True)]
        metric = getattr(self, f"{split}_map")
        metric.update(detections, targets)
        self.log(f"{split}/map", metric, prog_bar=split == "val", on_epoch=True, batch_size=len(targets))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval(batch, "test")

    def on_test_epoch_end(self) -> None:
        # Read before Lightning resets the metric at the end of the epoch.
        per_class = self.test_map.average_precisions().mean(axis=1)
        self._test_ap = {f"ap_{name}": 100.0 * float(ap) for name, ap in zip(self.class_names, per_class, strict=True)}

    def extra_results(self) -> dict[str, Any]:
        return dict(self._test_ap)
