"""The YOLOv8/YOLOv10 detection loss, and the two ways of reading detections off the heads.

Loss of one head, given a task-aligned assignment (:mod:`.assigner`), all normalised by the
sum of the soft targets:
* classification: binary cross-entropy of every point and class against the soft targets;
* box: complete-IoU loss (Zheng et al., 2020, arXiv:1911.08287) of the foreground points,
  each weighted by its soft target;
* distribution focal loss (:func:`.head.distribution_focal_loss`) of the same points.
The weights 7.5 (box), 0.5 (classification) and 1.5 (DFL) are the published YOLOv8/YOLOv10
training settings (listed in YOLOv10's appendix of hyper-parameters). YOLOv10 trains the sum of both heads'
losses: one-to-many with top-10 assignment, one-to-one with top-1, same metric.

Inference: the one-to-one head is read NMS-free (the top-scoring point-class pairs), as
YOLOv10 deploys it; the one-to-many head needs class-wise NMS (``torchvision.ops``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import batched_nms, complete_box_iou_loss

from .assigner import Targets, TaskAlignedAssigner
from .head import BranchOutput, DetectorOutput, boxes_to_distances, distribution_focal_loss

BOX_GAIN, CLASS_GAIN, DFL_GAIN = 7.5, 0.5, 1.5
ONE_TO_MANY_TOPK = 10


class DetectionLoss:
    def __init__(self, reg_max: int, one_to_many_topk: int = ONE_TO_MANY_TOPK) -> None:
        self.reg_max = reg_max
        self.one_to_many = TaskAlignedAssigner(one_to_many_topk)
        self.one_to_one = TaskAlignedAssigner(1)

    def __call__(self, output: DetectorOutput, targets: Targets) -> tuple[Tensor, dict[str, Tensor]]:
        """Total loss and its parts (per head: ``box``, ``cls``, ``dfl``) for logging."""
        many = self.branch(output.one_to_many, output, targets, self.one_to_many)
        one = self.branch(output.one_to_one, output, targets, self.one_to_one)
        total = sum(BOX_GAIN * p["box"] + CLASS_GAIN * p["cls"] + DFL_GAIN * p["dfl"] for p in (many, one))
        parts = {f"o2m_{k}": v.detach() for k, v in many.items()} | {f"o2o_{k}": v.detach() for k, v in one.items()}
        return total, parts  # type: ignore[return-value]

    def branch(
        self, branch: BranchOutput, output: DetectorOutput, targets: Targets, assigner: TaskAlignedAssigner
    ) -> dict[str, Tensor]:
        logits = branch.class_logits.float()
        assignment = assigner(logits.sigmoid().detach(), branch.boxes.detach(), output.points, targets)
        normaliser = assignment.target_scores.sum().clamp_min(1.0)
        cls = F.binary_cross_entropy_with_logits(logits, assignment.target_scores, reduction="sum") / normaliser
        fg = assignment.foreground
        if not fg.any():  # no box in the batch: only the classification loss teaches (background)
            zero = branch.boxes.sum() * 0.0
            return {"box": zero, "cls": cls, "dfl": zero}
        weight = assignment.target_scores.sum(-1)[fg]
        target_boxes = assignment.target_boxes[fg]
        box = (complete_box_iou_loss(branch.boxes[fg], target_boxes, reduction="none") * weight).sum() / normaliser
        points = output.points.expand(fg.shape[0], -1, -1)[fg]
        strides = output.strides.expand(fg.shape[0], -1)[fg]
        # Targets in bins, kept inside the last interval so that both neighbouring bins exist.
        distances = (boxes_to_distances(target_boxes, points) / strides[:, None]).clamp(0, self.reg_max - 1 - 0.01)
        dfl = (distribution_focal_loss(branch.box_logits[fg], distances) * weight).sum() / normaliser
        return {"box": box, "cls": cls, "dfl": dfl}


Detections = list[dict[str, Tensor]]  # per image: boxes (n, 4), scores (n,), labels (n,)


def one_to_one_detections(branch: BranchOutput, max_detections: int) -> Detections:
    """NMS-free: the ``max_detections`` highest (point, class) scores of each image."""
    scores = branch.class_logits.float().sigmoid()
    num_classes = scores.shape[-1]
    top, index = scores.flatten(1).topk(min(max_detections, scores[0].numel()), dim=1)
    point = torch.div(index, num_classes, rounding_mode="floor")
    boxes = branch.boxes.gather(1, point[..., None].expand(-1, -1, 4))
    return [{"boxes": b, "scores": s, "labels": i % num_classes} for b, s, i in zip(boxes, top, index, strict=True)]


def one_to_many_detections(
    branch: BranchOutput, max_detections: int, iou_threshold: float = 0.7, score_threshold: float = 0.001
) -> Detections:
    """Class-wise NMS over every (point, class) pair above ``score_threshold`` (YOLOv8's
    evaluation settings: 0.7 and 0.001), then the ``max_detections`` best."""
    scores = branch.class_logits.float().sigmoid()
    detections = []
    for image_scores, image_boxes in zip(scores, branch.boxes, strict=True):
        point, label = torch.nonzero(image_scores > score_threshold, as_tuple=True)
        kept_scores = image_scores[point, label]
        keep = batched_nms(image_boxes[point].float(), kept_scores, label, iou_threshold)[:max_detections]
        detections.append({"boxes": image_boxes[point[keep]], "scores": kept_scores[keep], "labels": label[keep]})
    return detections
