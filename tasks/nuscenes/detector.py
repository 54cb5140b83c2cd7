"""The detector: UniTR-style backbone, CenterPoint-style head, and their loss and decoding."""

from __future__ import annotations

from torch import Tensor, nn

from .head import CenterHead, CenterTargets, focal_loss, regression_loss


class UniTRDetector(nn.Module):
    """batch dict -> heatmap logits and box regression on the head's BEV grid.

    ``loss(batch)`` = heatmap focal loss + ``regression_weight`` x L1 box loss (CenterPoint's
    weighting 1 : 0.25); ``detect(batch)`` = decoded boxes per sample.
    """

    def __init__(
        self,
        backbone: nn.Module,
        head: CenterHead,
        targets: CenterTargets,
        num_classes: int,
        max_detections: int,
        regression_weight: float = 0.25,
    ) -> None:
        super().__init__()
        self.backbone, self.head, self.targets = backbone, head, targets
        self.num_classes, self.max_detections, self.regression_weight = num_classes, max_detections, regression_weight

    def forward(self, batch: dict) -> tuple[Tensor, Tensor]:
        return self.head(self.backbone(batch))

    def loss(self, batch: dict) -> Tensor:
        heatmap, regression = self(batch)
        target = self.targets.encode(batch["boxes"], batch["labels"], self.num_classes)
        return focal_loss(heatmap, target["heatmap"]) + self.regression_weight * regression_loss(regression, target)

    def detect(self, batch: dict) -> list[dict[str, Tensor]]:
        heatmap, regression = self(batch)
        return self.targets.decode(heatmap.float(), regression.float(), self.max_detections)
