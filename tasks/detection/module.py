"""The detection training module: YOLOv10's dual loss, COCO mAP of the NMS-free head.

Validation and test read detections off the one-to-one head without NMS (as YOLOv10
deploys it) and score them with torchmetrics' COCO mAP@[.5:.95] (pycocotools backend): the
task's metric ``map``. The test also reports AP50 and AP75 and, for comparison, the
one-to-many head with NMS (``extra_results``). A task whose evaluation protocol leaves some
detections out (GEN1: Prophesee's box-size rule) passes ``keep_detection``; it applies to both
heads, in validation and test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torchmetrics.detection import MeanAveragePrecision

from pe_bench.harness.config import OptimConfig
from pe_bench.harness.module import TaskModule

from .assigner import Targets
from .head import DetectorOutput
from .loss import DetectionLoss, Detections, one_to_many_detections, one_to_one_detections


def mean_average_precision() -> MeanAveragePrecision:
    return MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend="pycocotools")


def _for_metric(detections: Detections) -> Detections:
    return [{k: v.detach().float().cpu() if k != "labels" else v.cpu() for k, v in d.items()} for d in detections]


def _truth(targets: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
    keys = ("boxes", "labels", "iscrowd")
    return [{k: t[k].detach().cpu() for k in keys if k in t} for t in targets]


#: (n, 4) boxes -> (n,) mask of the detections the evaluation scores
DetectionFilter = Callable[[Tensor], Tensor]


class DetectionModule(TaskModule):
    def __init__(
        self,
        model: nn.Module,
        optim: OptimConfig,
        reg_max: int,
        max_detections: int,
        keep_detection: DetectionFilter | None = None,
    ) -> None:
        super().__init__(model, optim)
        self.loss = DetectionLoss(reg_max)
        self.max_detections = max_detections
        self.keep_detection = keep_detection
        self.val_map = mean_average_precision()
        self.test_map = mean_average_precision()
        self.test_map_nms = mean_average_precision()
        self._extra: dict[str, float] = {}

    def forward(self, inputs: Any) -> DetectorOutput:
        return self.model(inputs)

    def scored(self, detections: Detections) -> Detections:
        """The detections as the metric takes them, less those the protocol leaves out."""
        detections = _for_metric(detections)
        if self.keep_detection is None:
            return detections
        return [{k: v[self.keep_detection(d["boxes"])] for k, v in d.items()} for d in detections]

    def batch_size_of(self, batch: tuple[Any, list]) -> int:
        return len(batch[1])

    def training_loss(self, batch: tuple[Any, list[dict[str, Tensor]]]) -> Tensor:
        inputs, targets = batch
        output = self(inputs)
        targets_padded = Targets.pad(targets, device=output.points.device)
        loss, parts = self.loss(output, targets_padded)
        self.log_dict(
            {f"train/{k}": v for k, v in parts.items()}, on_step=False, on_epoch=True, batch_size=len(targets)
        )
        return loss

    def validation_step(self, batch: tuple[Any, list[dict[str, Tensor]]], batch_idx: int) -> None:
        inputs, targets = batch
        output = self(inputs)
        self.val_map.update(self.scored(one_to_one_detections(output.one_to_one, self.max_detections)), _truth(targets))

    def on_validation_epoch_end(self) -> None:
        self.log("val/map", float(self.val_map.compute()["map"]), prog_bar=True)
        self.val_map.reset()

    def test_step(self, batch: tuple[Any, list[dict[str, Tensor]]], batch_idx: int) -> None:
        inputs, targets = batch
        output = self(inputs)
        truth = _truth(targets)
        self.test_map.update(self.scored(one_to_one_detections(output.one_to_one, self.max_detections)), truth)
        self.test_map_nms.update(self.scored(one_to_many_detections(output.one_to_many, self.max_detections)), truth)

    def on_test_epoch_end(self) -> None:
        result, nms = self.test_map.compute(), self.test_map_nms.compute()
        self.log("test/map", float(result["map"]))
        self._extra = {
            "ap50": 100.0 * float(result["map_50"]),
            "ap75": 100.0 * float(result["map_75"]),
            "map_one_to_many_nms": 100.0 * float(nms["map"]),
        }
        self.test_map.reset()
        self.test_map_nms.reset()

    def extra_results(self) -> dict[str, float]:
        """AP50 and AP75 (%) of the NMS-free head, and the mAP (%) of the one-to-many head with NMS."""
        return dict(self._extra)
