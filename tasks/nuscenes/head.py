"""A CenterPoint-style BEV detection head (Yin et al., "Center-based 3D Object Detection and
Tracking", CVPR 2021, arXiv:2006.11275).

A small convolutional BEV trunk, then per class a centre heatmap (sigmoid, CenterNet's
penalty-reduced focal loss against Gaussians drawn at the box centres) and, at every cell,
a box regression read only at ground-truth centres (L1): offset of the centre inside its
cell (2), height of the centre (1), log size (3), sin and cos of the heading (2). Decoding
keeps the 3 x 3 local maxima of the heatmap and the ``max_detections`` best of them per
sample. (UniTR's own head is TransFusion's, which adds a transformer decoder over heatmap
proposals; the centre heatmap and box regression are the part kept here.)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .unitr import VoxelGrid

REGRESSION = 8  # dx, dy, z, log l, log w, log h, sin yaw, cos yaw
HEATMAP_PRIOR = 0.1  # initial heatmap probability (CenterPoint's bias -2.19)


def conv_bn_relu(in_channels: int, out_channels: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
    )


class CenterHead(nn.Module):
    """BEV map (B, C_in, X, Y) -> heatmap logits (B, classes, X', Y') and regression (B, 8, X', Y'),
    X' = X / stride."""

    def __init__(self, in_channels: int, channels: int, num_classes: int, blocks: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.trunk = nn.Sequential(
            conv_bn_relu(in_channels, channels, stride), *(conv_bn_relu(channels, channels) for _ in range(blocks))
        )
        self.heatmap = nn.Sequential(conv_bn_relu(channels, channels), nn.Conv2d(channels, num_classes, 1))
        self.regression = nn.Sequential(conv_bn_relu(channels, channels), nn.Conv2d(channels, REGRESSION, 1))
        nn.init.constant_(self.heatmap[-1].bias, -math.log((1 - HEATMAP_PRIOR) / HEATMAP_PRIOR))

    def forward(self, bev: Tensor) -> tuple[Tensor, Tensor]:
        x = self.trunk(bev)
        return self.heatmap(x), self.regression(x)


def gaussian_radius(length: float, width: float, min_overlap: float) -> float:
    """CenterNet's radius (in cells) within which a shifted box keeps ``min_overlap`` IoU."""
    b1 = length + width
    c1 = width * length * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + math.sqrt(b1**2 - 4 * c1)) / 2
    b2 = 2 * (length + width)
    c2 = (1 - min_overlap) * width * length
    r2 = (b2 + math.sqrt(b2**2 - 16 * c2)) / 2
    a3 = 4 * min_overlap
    b3 = -2 * min_overlap * (length + width)
    c3 = (min_overlap - 1) * width * length
    r3 = (b3 + math.sqrt(b3**2 - 4 * a3 * c3)) / 2
    return min(r1, r2, r3)


class CenterTargets:
    """Encoding of boxes on the head's grid (cell = ``stride`` BEV cells) and decoding back."""

    def __init__(self, grid: VoxelGrid, stride: int, min_radius: int, min_overlap: float = 0.1) -> None:
        self.grid, self.stride = grid, stride
        self.cell = (grid.voxel_size[0] * stride, grid.voxel_size[1] * stride)
        self.shape = (grid.shape[0] // stride, grid.shape[1] // stride)
        self.min_radius, self.min_overlap = min_radius, min_overlap

    def _continuous(self, xy: Tensor) -> Tensor:
        lower = torch.tensor(self.grid.point_range[:2], device=xy.device, dtype=xy.dtype)
        return (xy - lower) / torch.tensor(self.cell, device=xy.device, dtype=xy.dtype)

    def encode(self, boxes: list[Tensor], labels: list[Tensor], num_classes: int) -> dict[str, Tensor]:
        """Heatmap (B, classes, X', Y'), and per box: sample, cell (x, y) and regression target."""
        sx, sy = self.shape
        device = boxes[0].device if boxes else torch.device("cpu")
        heatmap = torch.zeros(len(boxes), num_classes, sx, sy, device=device)
        rows = {"sample": [], "cell": [], "target": []}
        xs, ys = torch.arange(sx, device=device), torch.arange(sy, device=device)
        for b, (box, label) in enumerate(zip(boxes, labels, strict=True)):
            if not len(box):
                continue
            c = self._continuous(box[:, :2])
            cell = torch.floor(c).long()
            inside = ((cell >= 0) & (cell < torch.tensor(self.shape, device=device))).all(-1)
            box, label, c, cell = box[inside], label[inside], c[inside], cell[inside]
            for k in range(len(box)):
                length, width = (box[k, 3] / self.cell[0]).item(), (box[k, 4] / self.cell[1]).item()
                radius = max(self.min_radius, int(gaussian_radius(length, width, self.min_overlap)))
                sigma = (2 * radius + 1) / 6
                dx = (xs - cell[k, 0]).float()[:, None]
                dy = (ys - cell[k, 1]).float()[None, :]
                blob = torch.exp(-(dx**2 + dy**2) / (2 * sigma**2))
                blob = torch.where((dx.abs() <= radius) & (dy.abs() <= radius), blob, torch.zeros_like(blob))
                heatmap[b, label[k]] = torch.maximum(heatmap[b, label[k]], blob)
            target = torch.cat(
                [
                    c - cell,
                    box[:, 2:3],
                    torch.log(box[:, 3:6].clamp_min(1e-3)),
                    torch.sin(box[:, 6:7]),
                    torch.cos(box[:, 6:7]),
                ],
                dim=-1,
            )
            rows["sample"].append(torch.full((len(box),), b, device=device))
            rows["cell"].append(cell)
            rows["target"].append(target)
        empty = {"sample": (0,), "cell": (0, 2), "target": (0, REGRESSION)}
        out = {
            k: torch.cat(v) if v else torch.zeros(empty[k], device=device, dtype=torch.long if k != "target" else None)
            for k, v in rows.items()
        }
        return {"heatmap": heatmap, **out}

    def decode(self, heatmap: Tensor, regression: Tensor, max_detections: int) -> list[dict[str, Tensor]]:
        """Per sample: ``boxes`` (K, 7), ``centres`` (K, 2), ``scores`` (K,), ``labels`` (K,)."""
        b_size, classes, sx, sy = heatmap.shape
        heat = heatmap.sigmoid()
        peaks = heat * (F.max_pool2d(heat, 3, stride=1, padding=1) == heat)
        k = min(max_detections, classes * sx * sy)
        scores, flat = peaks.view(b_size, -1).topk(k, dim=1)
        labels = torch.div(flat, sx * sy, rounding_mode="floor")
        cell = flat % (sx * sy)
        ix, iy = torch.div(cell, sy, rounding_mode="floor"), cell % sy
        reg = regression.permute(0, 2, 3, 1).reshape(b_size, sx * sy, REGRESSION)
        reg = torch.gather(reg, 1, cell[..., None].expand(-1, -1, REGRESSION))
        lower = heatmap.new_tensor(self.grid.point_range[:2])
        size = heatmap.new_tensor(self.cell)
        xy = (torch.stack([ix, iy], dim=-1).to(reg.dtype) + reg[..., :2]) * size + lower
        boxes = torch.cat(
            [xy, reg[..., 2:3], reg[..., 3:6].clamp(max=5.0).exp(), torch.atan2(reg[..., 6:7], reg[..., 7:8])], dim=-1
        )
        return [{"boxes": boxes[b], "centres": xy[b], "scores": scores[b], "labels": labels[b]} for b in range(b_size)]


def focal_loss(logits: Tensor, target: Tensor) -> Tensor:
    """CenterNet's penalty-reduced focal loss (alpha 2, beta 4), normalised by the number of centres."""
    p = logits.float().sigmoid().clamp(1e-4, 1 - 1e-4)
    positive = target.eq(1).float()
    pos_loss = torch.log(p) * (1 - p) ** 2 * positive
    neg_loss = torch.log(1 - p) * p**2 * (1 - target) ** 4 * (1 - positive)
    return -(pos_loss.sum() + neg_loss.sum()) / positive.sum().clamp_min(1.0)


def regression_loss(regression: Tensor, targets: dict[str, Tensor]) -> Tensor:
    """L1 at the ground-truth centre cells, mean over boxes and the 8 channels."""
    if not len(targets["sample"]):
        return regression.sum() * 0.0
    pred = regression[targets["sample"], :, targets["cell"][:, 0], targets["cell"][:, 1]]  # (K, 8)
    return F.l1_loss(pred.float(), targets["target"].float())
