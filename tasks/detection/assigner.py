"""Task-aligned label assignment (TOOD: Feng et al., 2021, arXiv:2108.07755, Section 3.2),
as YOLOv8 and both heads of YOLOv10 use it.

For a ground-truth box g and an anchor point a whose centre lies inside g, the alignment
metric is t = s^alpha * u^beta, with s the predicted probability of g's class at a and u the
IoU of a's predicted box with g. Each box takes the ``topk`` points of largest t as its
positives (YOLOv10: top-10 for the one-to-many head, top-1 for the one-to-one head, both with
alpha = 0.5, beta = 6: the consistent matching metric of its Section 3.1). A point claimed by
several boxes keeps the one it overlaps most. The classification target of a positive is a
soft label at g's class: t normalised so that g's best point gets g's largest IoU
(TOOD Eq. 10), which ties the score to the localisation quality.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_iou


@dataclass
class Assignment:
    target_boxes: Tensor  # (B, A, 4) the assigned box of every point (meaningless where not foreground)
    target_scores: Tensor  # (B, A, C) soft labels: normalised alignment at the assigned class, else 0
    foreground: Tensor  # (B, A) bool


@dataclass
class Targets:
    """Ground truth of a batch, padded to M boxes per image."""

    boxes: Tensor  # (B, M, 4) x1, y1, x2, y2 in pixels
    labels: Tensor  # (B, M) class indices (0 where padding)
    valid: Tensor  # (B, M) bool, False for padding

    @staticmethod
    def pad(targets: list[dict[str, Tensor]], device: torch.device | None = None) -> Targets:
        """Per-image ``{"boxes": (n, 4), "labels": (n,)}`` -> padded batch."""
        most = max([len(t["labels"]) for t in targets] + [1])
        boxes = torch.zeros(len(targets), most, 4, device=device)
        labels = torch.zeros(len(targets), most, dtype=torch.long, device=device)
        valid = torch.zeros(len(targets), most, dtype=torch.bool, device=device)
        for i, target in enumerate(targets):
            n = len(target["labels"])
            boxes[i, :n] = target["boxes"].to(boxes)
            labels[i, :n] = target["labels"].to(labels.device)
            valid[i, :n] = True
        return Targets(boxes, labels, valid)


class TaskAlignedAssigner:
    def __init__(self, topk: int, alpha: float = 0.5, beta: float = 6.0, eps: float = 1e-9) -> None:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        self.topk, self.alpha, self.beta, self.eps = topk, alpha, beta, eps

    @torch.no_grad()
    def __call__(self, scores: Tensor, boxes: Tensor, points: Tensor, targets: Targets) -> Assignment:
        """scores (B, A, C) predicted probabilities, boxes (B, A, 4) predicted boxes, points
        (A, 2) anchor points (x, y)."""
        batch, num_points, num_classes = scores.shape
        gt_boxes = targets.boxes.float()
        x, y = points[:, 0], points[:, 1]
        x1, y1, x2, y2 = (gt_boxes[..., i : i + 1] for i in range(4))  # each (B, M, 1)
        candidates = (x > x1) & (x < x2) & (y > y1) & (y < y2) & targets.valid[..., None]  # (B, M, A)
        iou = torch.stack([box_iou(g, b) for g, b in zip(gt_boxes, boxes.float(), strict=True)]).clamp_min(
            0
        )  # (B, M, A)
        class_index = targets.labels[..., None].expand(-1, -1, num_points)
        class_score = scores.float().transpose(1, 2).gather(1, class_index)  # (B, M, A)
        alignment = class_score.pow(self.alpha) * iou.pow(self.beta) * candidates

        # The top-k candidates of each box (non-candidates ranked last, then dropped).
        k = min(self.topk, num_points)
        ranked = torch.where(candidates, alignment, torch.full_like(alignment, -1.0))
        top = ranked.topk(k, dim=-1).indices
        positive = torch.zeros_like(candidates).scatter_(-1, top, True) & candidates

        # A point claimed by several boxes keeps the one its prediction overlaps most.
        claimed = positive.sum(1, keepdim=True) > 1  # (B, 1, A)
        best = torch.where(positive, iou, torch.full_like(iou, -1.0)).argmax(1, keepdim=True)  # (B, 1, A)
        best_only = torch.zeros_like(positive).scatter_(1, best, True)
        positive = torch.where(claimed, best_only & positive, positive)

        foreground = positive.any(1)  # (B, A)
        gt_index = positive.float().argmax(1)  # (B, A)
        target_boxes = gt_boxes.gather(1, gt_index[..., None].expand(-1, -1, 4))
        target_labels = targets.labels.gather(1, gt_index)

        # TOOD Eq. 10: t / max t * max IoU, per box over its positives.
        alignment = alignment * positive
        best_alignment = alignment.amax(-1, keepdim=True)
        best_iou = (iou * positive).amax(-1, keepdim=True)
        quality = (alignment * best_iou / (best_alignment + self.eps)).amax(1)  # (B, A)
        target_scores = F.one_hot(target_labels, num_classes).float() * (quality * foreground)[..., None]
        return Assignment(target_boxes, target_scores, foreground)
