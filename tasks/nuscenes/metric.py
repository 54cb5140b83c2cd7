"""nuScenes detection mAP (Caesar et al., "nuScenes: A Multimodal Dataset for Autonomous
Driving", CVPR 2020, Section 4.1), as the nuscenes-devkit computes it.

Matching is by centre distance on the ground plane (x, y), not by IoU. For one class and one
distance threshold d: predictions of that class, over all samples, are taken in order of
decreasing score (ties: the later prediction first, as the devkit sorts); each is matched to
the closest not yet matched ground-truth box of its class in its own sample, and is a true
positive if that distance is below d (otherwise a false positive, and the box stays free).
Precision and recall of the ranked list are interpolated at 101 recall points 0, 0.01, ..., 1
(``np.interp``, precision 0 beyond the highest recall reached; not made monotone); AP is the
mean over the recall points above 0.1 of max(precision - 0.1, 0), divided by 0.9. A class
without ground truth, or without a single true positive, has AP 0. mAP is the mean of AP over
the classes and the thresholds 0.5, 1, 2 and 4 m. The devkit's other steps are not applied:
its class ranges (boxes beyond 30-50 m from the ego are dropped; the tiny scenes end at 16 m)
and its true-positive error metrics and NDS.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

DISTANCE_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)  # metres
MIN_RECALL = 0.1
MIN_PRECISION = 0.1
RECALL_POINTS = 101


def descending(scores: np.ndarray) -> np.ndarray:
    """Indices by decreasing score, ties by decreasing index (the devkit's order)."""
    return np.lexsort((-np.arange(len(scores)), -scores))


def match(pred_xy: np.ndarray, scores: np.ndarray, gt_xy: np.ndarray, thresholds: Sequence[float]) -> np.ndarray:
    """True-positive flags (P, T) of one sample's predictions of one class against its
    ground truth of that class, one column per distance threshold."""
    tp = np.zeros((len(pred_xy), len(thresholds)), dtype=bool)
    if not len(pred_xy) or not len(gt_xy):
        return tp
    distance = np.linalg.norm(pred_xy[:, None, :2] - gt_xy[None, :, :2], axis=-1)  # (P, G)
    order = descending(scores)
    for t, threshold in enumerate(thresholds):
        taken = np.zeros(len(gt_xy), dtype=bool)
        for p in order:
            free = np.where(taken, np.inf, distance[p])
            nearest = int(np.argmin(free))  # the first of equally close boxes, as the devkit
            if free[nearest] < threshold:
                taken[nearest] = True
                tp[p, t] = True
    return tp


def average_precision(scores: np.ndarray, tp: np.ndarray, num_gt: int) -> float:
    """The devkit's ``accumulate`` + ``calc_ap`` for one class and threshold: ``tp`` flags (P,)
    of all predictions of the class, ``num_gt`` its ground-truth boxes."""
    if num_gt == 0 or not tp.any():
        return 0.0
    order = descending(scores)
    hits = np.cumsum(tp[order]).astype(float)
    misses = np.cumsum(~tp[order]).astype(float)
    precision = hits / (hits + misses)
    recall = hits / num_gt
    grid = np.linspace(0.0, 1.0, RECALL_POINTS)
    interpolated = np.interp(grid, recall, precision, right=0)
    kept = interpolated[round(100 * MIN_RECALL) + 1 :] - MIN_PRECISION
    return float(np.mean(np.clip(kept, 0.0, None))) / (1.0 - MIN_PRECISION)


class CentreDistanceMAP(Metric):
    """The mAP above, accumulated over batches (predictions are matched within their sample
    when they arrive; the ranking over samples happens in :meth:`compute`).

    ``update(preds, targets)`` takes one dict per sample: predictions with ``centres`` (P, >=2),
    ``scores`` (P,), ``labels`` (P,); targets with ``centres`` (G, >=2) and ``labels`` (G,).
    """

    full_state_update = False

    def __init__(self, num_classes: int, thresholds: Sequence[float] = DISTANCE_THRESHOLDS) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.thresholds = tuple(thresholds)
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")
        self.add_state("true_positives", default=[], dist_reduce_fx="cat")
        self.add_state("num_gt", default=torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Sequence[dict[str, Tensor]], targets: Sequence[dict[str, Tensor]]) -> None:
        if len(preds) != len(targets):
            raise ValueError(f"{len(preds)} predictions for {len(targets)} samples")
        for pred, target in zip(preds, targets, strict=True):
            p_xy, p_score, p_label = (pred[k].detach().cpu().double().numpy() for k in ("centres", "scores", "labels"))
            g_xy, g_label = (target[k].detach().cpu().double().numpy() for k in ("centres", "labels"))
            tp = np.zeros((len(p_score), len(self.thresholds)), dtype=bool)
            for c in range(self.num_classes):
                mine = p_label == c
                tp[mine] = match(p_xy[mine], p_score[mine], g_xy[g_label == c], self.thresholds)
            self.scores.append(torch.as_tensor(p_score, device=self.device))
            self.labels.append(torch.as_tensor(p_label, dtype=torch.long, device=self.device))
            self.true_positives.append(torch.as_tensor(tp, device=self.device))
            self.num_gt += torch.bincount(torch.as_tensor(g_label, dtype=torch.long), minlength=self.num_classes).to(
                self.num_gt.device
            )

    def average_precisions(self) -> np.ndarray:
        """AP (num_classes, num_thresholds) of everything accumulated."""
        # A list of per-sample tensors, or one tensor once synchronised across processes.
        cat = lambda items, empty: dim_zero_cat(items).cpu().numpy() if len(items) else empty  # noqa: E731
        scores = cat(self.scores, np.zeros(0))
        labels = cat(self.labels, np.zeros(0, dtype=np.int64))
        tp = cat(self.true_positives, np.zeros((0, len(self.thresholds)), dtype=bool))
        num_gt = self.num_gt.cpu().numpy()
        return np.array(
            [
                [average_precision(scores[labels == c], tp[labels == c, t], int(num_gt[c])) for t in range(tp.shape[1])]
                for c in range(self.num_classes)
            ]
        )

    def compute(self) -> Tensor:
        return torch.tensor(float(self.average_precisions().mean()))
