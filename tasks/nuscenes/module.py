"""The Lightning module of the nuScenes task: detection loss in training, mAP in evaluation
(and NDS with its true-positive errors in the test's extra results)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from pe_bench.harness.config import OptimConfig
from pe_bench.harness.module import TaskModule

from .detector import UniTRDetector
from .metric import NOT_PREDICTED, CentreDistanceMAP


class DetectionModule(TaskModule):
    """``train/loss``; ``val/map`` and ``test/map`` (centre-distance mAP, a fraction). Extra
    results of the test: AP per class ``ap_<class>`` (mean over the distance thresholds, %),
    ``nds`` (%), the mean true-positive errors in the devkit's units, ``ate`` (m), ``ase``
    (1 - IoU), ``aoe`` (rad), and ``ave`` and ``aae`` at their worst value 1, listed under
    ``not_predicted`` (the model predicts no velocity and no attributes; NDS counts them so).
    ``class_ranges`` (real nuScenes): the devkit's distance limit per class, applied to both sides
    with each sample's ``ego_frame``; each sample's ``bike_racks`` (real nuScenes) go to the
    metric's bike-rack filter."""

    def __init__(
        self,
        model: UniTRDetector,
        class_names: list[str],
        optim: OptimConfig,
        class_ranges: list[float] | None = None,
    ) -> None:
        super().__init__(model, optim)
        self.class_names = list(class_names)
        self.val_map = CentreDistanceMAP(len(class_names), class_names=class_names, class_ranges=class_ranges)
        self.test_map = CentreDistanceMAP(len(class_names), class_names=class_names, class_ranges=class_ranges)
        self._test_results: dict[str, Any] = {}

    def training_loss(self, batch: dict) -> Tensor:
        return self.model.loss(batch)

    def batch_size_of(self, batch: dict) -> int:
        return len(batch["boxes"])

    def _eval(self, batch: dict, split: str) -> None:
        detections = self.model.detect(batch)
        targets = [{"boxes": b, "labels": y} for b, y in zip(batch["boxes"], batch["labels"], strict=True)]
        for key in ("ego_frame", "bike_racks"):  # real nuScenes only: the devkit's filters
            if key in batch:
                targets = [target | {key: value} for target, value in zip(targets, batch[key], strict=True)]
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
        results: dict[str, Any] = {
            f"ap_{name}": 100.0 * float(ap) for name, ap in zip(self.class_names, per_class, strict=True)
        }
        summary = self.test_map.summary()
        results["nds"] = 100.0 * summary["nds"]
        results |= {k: v for k, v in summary.items() if k not in ("map", "nds")}
        results["not_predicted"] = list(NOT_PREDICTED)
        self._test_results = results

    def extra_results(self) -> dict[str, Any]:
        return dict(self._test_results)
