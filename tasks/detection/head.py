"""The anchor-free detection head of YOLOv8 with YOLOv10's dual assignments.

YOLOv8 (as described in the YOLOv10 paper, Wang et al., 2024, arXiv:2405.14458, and its
predecessors): every cell of every pyramid level is an anchor *point*; a decoupled head
predicts per point the class scores (sigmoid, no objectness) and the box as four distances
(left, top, right, bottom) from the point, in units of the level stride. Each distance is a
discrete distribution over ``reg_max`` bins (Li et al., 2020, "Generalized Focal Loss",
arXiv:2006.04388), decoded as its expectation.

YOLOv10 (Section 3.1): two such heads share the backbone and neck. The one-to-many head is
trained with top-k label assignment and needs NMS at inference; the one-to-one head is trained
with top-1 assignment under the *same* matching metric (consistent dual assignments) and is
used NMS-free at inference. YOLOv10's lightweight classification branch (Section 3.2): two
depthwise-separable 3x3 convolutions and a 1x1 output convolution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ConvNormAct(nn.Sequential):
    """Convolution, BatchNorm and SiLU: the convolution unit of the YOLO heads."""

    def __init__(self, in_dim: int, out_dim: int, kernel: int, groups: int = 1) -> None:
        super().__init__(
            nn.Conv2d(in_dim, out_dim, kernel, padding=kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(out_dim),
            nn.SiLU(inplace=True),
        )


def box_branch(in_dim: int, width: int, reg_max: int) -> nn.Sequential:
    """Two 3x3 convolutions, then 4 x ``reg_max`` distance logits per point."""
    return nn.Sequential(ConvNormAct(in_dim, width, 3), ConvNormAct(width, width, 3), nn.Conv2d(width, 4 * reg_max, 1))


def class_branch(in_dim: int, width: int, num_classes: int, kernel: int = 3) -> nn.Sequential:
    """YOLOv10's lightweight classification branch: 2 x (depthwise 3x3 + pointwise 1x1), 1x1
    out (``kernel`` replaces the depthwise 3)."""
    return nn.Sequential(
        ConvNormAct(in_dim, in_dim, kernel, groups=in_dim),
        ConvNormAct(in_dim, width, 1),
        ConvNormAct(width, width, kernel, groups=width),
        ConvNormAct(width, width, 1),
        nn.Conv2d(width, num_classes, 1),
    )


def anchor_points(shapes: list[tuple[int, int]], strides: list[float], device: torch.device) -> tuple[Tensor, Tensor]:
    """Cell centres of every level, (A, 2) as (x, y) in pixels, and the (A,) stride of each."""
    points, point_strides = [], []
    for (h, w), stride in zip(shapes, strides, strict=True):
        y, x = torch.meshgrid(
            torch.arange(h, device=device, dtype=torch.float32),
            torch.arange(w, device=device, dtype=torch.float32),
            indexing="ij",
        )
        points.append((torch.stack([x, y], dim=-1).reshape(-1, 2) + 0.5) * stride)
        point_strides.append(torch.full((h * w,), float(stride), device=device))
    return torch.cat(points), torch.cat(point_strides)


def expected_distances(box_logits: Tensor) -> Tensor:
    """(..., 4, reg_max) distribution logits -> (..., 4) expected distances in stride units."""
    bins = torch.arange(box_logits.shape[-1], device=box_logits.device, dtype=box_logits.dtype)
    # The softmax written out: over a last dimension this short, torch's CPU softmax kernel is
    # about 4x slower than these elementwise steps (measured with 8 and 16 bins).
    weights = (box_logits - box_logits.amax(-1, keepdim=True).detach()).exp()
    return (weights @ bins) / weights.sum(-1)


def distances_to_boxes(distances: Tensor, points: Tensor) -> Tensor:
    """(left, top, right, bottom) distances in pixels around (x, y) points -> (x1, y1, x2, y2)."""
    return torch.cat([points - distances[..., :2], points + distances[..., 2:]], dim=-1)


def boxes_to_distances(boxes: Tensor, points: Tensor) -> Tensor:
    """Inverse of :func:`distances_to_boxes` (distances may be negative for outside points)."""
    return torch.cat([points - boxes[..., :2], boxes[..., 2:] - points], dim=-1)


@dataclass
class BranchOutput:
    """Predictions of one head at every anchor point (A points over all levels)."""

    class_logits: Tensor  # (B, A, C)
    box_logits: Tensor  # (B, A, 4, reg_max)
    boxes: Tensor  # (B, A, 4) decoded (x1, y1, x2, y2) in pixels


@dataclass
class DetectorOutput:
    points: Tensor  # (A, 2) anchor points (x, y) in pixels
    strides: Tensor  # (A,) stride of each point's level
    one_to_many: BranchOutput
    one_to_one: BranchOutput


class Head(nn.Module):
    """One head (one-to-many or one-to-one): a box and a class branch per pyramid level."""

    def __init__(
        self, in_dim: int, levels: int, num_classes: int, reg_max: int, class_kernel: int = 3, prior: float = 0.01
    ) -> None:
        super().__init__()
        self.reg_max = reg_max
        box_width = max(in_dim // 4, 4 * reg_max)
        self.box = nn.ModuleList(box_branch(in_dim, box_width, reg_max) for _ in range(levels))
        self.cls = nn.ModuleList(class_branch(in_dim, in_dim, num_classes, class_kernel) for _ in range(levels))
        for branch in self.cls:
            # RetinaNet's prior (Lin et al., 2017, arXiv:1708.02002, Section 4.1): every point
            # starts at probability ``prior`` for every class, so the many background points do
            # not swamp the first updates of the classification loss.
            nn.init.constant_(branch[-1].bias, -math.log((1 - prior) / prior))

    def forward(self, features: list[Tensor], points: Tensor, strides: Tensor) -> BranchOutput:
        batch = features[0].shape[0]
        box_logits = torch.cat([b(f).flatten(2) for b, f in zip(self.box, features, strict=True)], dim=2)
        class_logits = torch.cat([c(f).flatten(2) for c, f in zip(self.cls, features, strict=True)], dim=2)
        box_logits = box_logits.transpose(1, 2).reshape(batch, -1, 4, self.reg_max)
        distances = expected_distances(box_logits.float()) * strides[:, None]
        boxes = distances_to_boxes(distances, points)
        return BranchOutput(class_logits.transpose(1, 2), box_logits, boxes)


class DualHead(nn.Module):
    """YOLOv10's one-to-many and one-to-one heads over the same pyramid levels."""

    def __init__(
        self, in_dim: int, strides: tuple[float, ...], num_classes: int, reg_max: int, class_kernel: int = 3
    ) -> None:
        super().__init__()
        self.strides = tuple(float(s) for s in strides)
        self.one_to_many = Head(in_dim, len(strides), num_classes, reg_max, class_kernel)
        self.one_to_one = Head(in_dim, len(strides), num_classes, reg_max, class_kernel)

    def forward(self, features: list[Tensor]) -> DetectorOutput:
        shapes = [tuple(f.shape[-2:]) for f in features]
        points, strides = anchor_points(shapes, list(self.strides), features[0].device)  # type: ignore[arg-type]
        return DetectorOutput(
            points, strides, self.one_to_many(features, points, strides), self.one_to_one(features, points, strides)
        )


def distribution_focal_loss(box_logits: Tensor, target: Tensor) -> Tensor:
    """DFL (Generalized Focal Loss, Eq. 6): cross-entropy towards the two bins around the
    continuous target, weighted by its distance to each. box_logits (N, 4, R), target (N, 4)
    in bins, inside [0, R - 1); returns (N,), the mean over the four sides."""
    left = target.long()
    right = left + 1
    weight_left = right.float() - target
    logits = box_logits.float().flatten(0, 1)
    loss = F.cross_entropy(logits, left.flatten(), reduction="none") * weight_left.flatten()
    loss = loss + F.cross_entropy(logits, right.flatten(), reduction="none") * (1 - weight_left.flatten())
    return loss.view(-1, 4).mean(-1)
