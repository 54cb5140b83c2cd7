"""nuScenes detection mAP and detection score (NDS) (Caesar et al., "nuScenes: A Multimodal
Dataset for Autonomous Driving", CVPR 2020, arXiv:1903.11027, Section 4.1), as the
nuscenes-devkit's detection evaluation computes them (its default config
``detection_cvpr_2019``).

mAP. Matching is by centre distance on the ground plane (x, y), not by IoU. For one class and
one distance threshold d: predictions of that class, over all samples, are taken in order of
decreasing score (ties: the later prediction first, as the devkit sorts); each is matched to
the closest not yet matched ground-truth box of its class in its own sample, and is a true
positive if that distance is below d (otherwise a false positive, and the box stays free).
Precision and recall of the ranked list are interpolated at 101 recall points 0, 0.01, ..., 1
(``np.interp``, precision 0 beyond the highest recall reached; not made monotone); AP is the
mean over the recall points above 0.1 of max(precision - 0.1, 0), divided by 0.9. A class
without ground truth, or without a single true positive, has AP 0. mAP is the mean of AP over
the classes and the thresholds 0.5, 1, 2 and 4 m.

True-positive errors, from the matching at 2 m: per matched prediction the translation error
ATE (centre distance on the ground plane, m), the scale error ASE (1 - IoU of the two boxes
moved to the same centre and heading) and the orientation error AOE (smallest yaw
difference, rad, with period 2 pi; pi for ``barrier``, whose front is not defined). Per class,
as the devkit's ``accumulate`` and ``calc_tp``: the running mean of each error down the ranked
matches is resampled at the confidence reached at each of the 101 recall points, and the
class's error is its mean over the points from recall 0.11 up to the highest recall reached;
a class that reaches no recall above 0.1 (or has no ground truth, or no match) has error 1.
The devkit leaves some errors undefined (nan) and excludes them from the mean over classes:
AOE, AVE and AAE of ``traffic_cone``, AVE and AAE of ``barrier``. The mean error of a metric
is the mean over the other classes.

Velocity (AVE) and attribute (AAE) errors: the model predicts neither, so they are not
measured; each is counted at its worst value 1 for every class where the devkit defines it,
which is what the devkit gives a submission with nan velocities and no attributes.

NDS = (5 mAP + sum over ATE, ASE, AOE, AVE, AAE of (1 - min(1, mean error))) / 10, as the
devkit's ``DetectionMetrics.nd_score`` (a metric whose error is undefined for every class
scores 0). With AVE = AAE = 1, NDS is at most 0.8.

Class ranges (``class_ranges``, given for real nuScenes): the devkit's ``filter_eval_boxes``
drops ground-truth boxes and predictions whose centre is ``class_range`` or farther from the ego
(:data:`DEVKIT_CLASS_RANGES`: 50 m for vehicles, 40 m for pedestrians and two-wheelers, 30 m for
barriers and cones), measured as the devkit does: on the ground plane, box centre minus ego
position in the global frame's axes. A sample then carries ``ego_frame`` (4, 4), the transform
from its boxes' frame to that one. Without ``class_ranges`` (the tiny scenes, which end at 16
m) every box counts.

Bicycle racks (``bike_racks``, given for real nuScenes): as the devkit's ``filter_eval_boxes``,
bicycles and motorcycles (:data:`BIKE_RACK_CLASSES`, by class name) whose centre lies in a
sample's ``static_object.bicycle_rack`` annotation count on neither side: parked two-wheelers
are not scored. The test is the devkit's ``points_in_box``: the 3-D centre inside the rack's
3-D box, faces included (not a ground-plane test). A sample carries ``bike_racks`` (R, 4, 4),
per rack the map from its boxes' frame into the rack's box scaled to the cube |x|, |y|, |z| <=
1/2 (:func:`.devkit.rack_frame`), so racks of any orientation are tested exactly; the test is
unchanged by the rigid map between the boxes' frame and the devkit's global one. The generated
scenes have no racks (nothing to filter, so they carry none).

Predictions per sample: at most :data:`MAX_PREDICTIONS_PER_SAMPLE` (500, the devkit's
``max_boxes_per_sample``). The devkit refuses a submission with more (``load_prediction``
asserts; it keeps no best 500), so a sample with more is an error here too, before any filter,
as the devkit counts them; the detector keeps ``model.head.max_detections`` per sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

DISTANCE_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)  # metres
TP_DISTANCE_THRESHOLD = 2.0  # metres: the matching that the true-positive errors are read from
MIN_RECALL = 0.1
MIN_PRECISION = 0.1
RECALL_POINTS = 101
MEAN_AP_WEIGHT = 5

TP_METRICS = ("ate", "ase", "aoe", "ave", "aae")
MEASURED = ("ate", "ase", "aoe")  # from the boxes; the model predicts no velocity and no attributes
NOT_PREDICTED = ("ave", "aae")  # counted at their worst, 1
UNDEFINED_ERRORS = {"traffic_cone": ("aoe", "ave", "aae"), "barrier": ("ave", "aae")}  # the devkit's nan
HALF_TURN_CLASSES = ("barrier",)  # orientation compared modulo pi
#: The devkit's ``max_boxes_per_sample`` (detection_cvpr_2019.json).
MAX_PREDICTIONS_PER_SAMPLE = 500
#: The classes that ``filter_eval_boxes`` drops inside a bicycle rack.
BIKE_RACK_CLASSES = ("bicycle", "motorcycle")
#: The devkit's ``class_range`` (detection_cvpr_2019.json), metres from the ego.
DEVKIT_CLASS_RANGES = {
    "car": 50.0, "truck": 50.0, "bus": 50.0, "trailer": 50.0, "construction_vehicle": 50.0,
    "pedestrian": 40.0, "motorcycle": 40.0, "bicycle": 40.0, "traffic_cone": 30.0, "barrier": 30.0,
}  # fmt: skip


def descending(scores: np.ndarray) -> np.ndarray:
    """Indices by decreasing score, ties by decreasing index (the devkit's order)."""
    return np.lexsort((-np.arange(len(scores)), -scores))


def assign(pred_xy: np.ndarray, scores: np.ndarray, gt_xy: np.ndarray, threshold: float) -> np.ndarray:
    """The ground-truth box (index, -1 for none) that each of one sample's predictions of one
    class is matched to at one distance threshold, greedily in score order."""
    matched = np.full(len(pred_xy), -1)
    if not len(pred_xy) or not len(gt_xy):
        return matched
    distance = np.linalg.norm(pred_xy[:, None, :2] - gt_xy[None, :, :2], axis=-1)  # (P, G)
    taken = np.zeros(len(gt_xy), dtype=bool)
    for p in descending(scores):
        free = np.where(taken, np.inf, distance[p])
        nearest = int(np.argmin(free))  # the first of equally close boxes, as the devkit
        if free[nearest] < threshold:
            taken[nearest] = True
            matched[p] = nearest
    return matched


def match(pred_xy: np.ndarray, scores: np.ndarray, gt_xy: np.ndarray, thresholds: Sequence[float]) -> np.ndarray:
    """True-positive flags (P, T) of one sample's predictions of one class against its
    ground truth of that class, one column per distance threshold."""
    columns = [assign(pred_xy, scores, gt_xy, threshold) >= 0 for threshold in thresholds]
    return np.stack(columns, axis=1) if columns else np.zeros((len(pred_xy), 0), dtype=bool)


def yaw_difference(gt_yaw: np.ndarray, pred_yaw: np.ndarray, period: float) -> np.ndarray:
    """The devkit's ``yaw_diff``: the smallest angle between the headings, in [0, pi]."""
    diff = (gt_yaw - pred_yaw + period / 2) % period - period / 2
    return np.abs(np.where(diff > np.pi, diff - 2 * np.pi, diff))


def scale_error(gt_size: np.ndarray, pred_size: np.ndarray) -> np.ndarray:
    """1 - the devkit's ``scale_iou``: IoU of boxes (..., 3 sizes) sharing centre and heading."""
    intersection = np.prod(np.minimum(gt_size, pred_size), axis=-1)
    union = np.prod(gt_size, axis=-1) + np.prod(pred_size, axis=-1) - intersection
    return 1.0 - intersection / union


def box_errors(pred: np.ndarray, gt: np.ndarray, period: float) -> np.ndarray:
    """ATE, ASE, AOE (N, 3) of predicted boxes (N, 7: x, y, z, l, w, h, yaw) against their matches."""
    translation = np.linalg.norm(pred[:, :2] - gt[:, :2], axis=-1)
    scale = scale_error(gt[:, 3:6], pred[:, 3:6])
    return np.stack([translation, scale, yaw_difference(gt[:, 6], pred[:, 6], period)], axis=1)


def ranked(scores: np.ndarray, tp: np.ndarray, num_gt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranking order, precision and recall down the ranked predictions of one class."""
    order = descending(scores)
    hits = np.cumsum(tp[order]).astype(float)
    misses = np.cumsum(~tp[order]).astype(float)
    return order, hits / (hits + misses), hits / num_gt


def average_precision(scores: np.ndarray, tp: np.ndarray, num_gt: int) -> float:
    """The devkit's ``accumulate`` + ``calc_ap`` for one class and threshold: ``tp`` flags (P,)
    of all predictions of the class, ``num_gt`` its ground-truth boxes."""
    if num_gt == 0 or not tp.any():
        return 0.0
    _, precision, recall = ranked(scores, tp, num_gt)
    grid = np.linspace(0.0, 1.0, RECALL_POINTS)
    interpolated = np.interp(grid, recall, precision, right=0)
    kept = interpolated[round(100 * MIN_RECALL) + 1 :] - MIN_PRECISION
    return float(np.mean(np.clip(kept, 0.0, None))) / (1.0 - MIN_PRECISION)


def true_positive_error(scores: np.ndarray, errors: np.ndarray, num_gt: int) -> np.ndarray:
    """The devkit's ``accumulate`` + ``calc_tp`` at the true-positive threshold for one class:
    ``errors`` (P, E) of all predictions of the class, nan rows for the unmatched; one error
    per column."""
    worst = np.ones(errors.shape[1])
    matched = ~np.isnan(errors[:, 0])
    if num_gt == 0 or not matched.any():
        return worst
    order, _, recall = ranked(scores, matched, num_gt)
    ranked_scores, ranked_matched = scores[order], matched[order]
    confidence = np.interp(np.linspace(0.0, 1.0, RECALL_POINTS), recall, ranked_scores, right=0)
    running_mean = np.cumsum(errors[order][ranked_matched], axis=0) / np.arange(1, ranked_matched.sum() + 1)[:, None]
    matched_scores = ranked_scores[ranked_matched]
    # The running mean at each recall point's confidence (np.interp needs increasing abscissae).
    resampled = np.stack(
        [np.interp(confidence[::-1], matched_scores[::-1], column[::-1])[::-1] for column in running_mean.T], axis=1
    )
    first = round(100 * MIN_RECALL) + 1
    reached = np.flatnonzero(confidence)
    last = int(reached[-1]) if len(reached) else 0  # the highest recall reached
    return worst if last < first else resampled[first : last + 1].mean(axis=0)


def within_range(boxes: np.ndarray, labels: np.ndarray, ranges: np.ndarray, ego_frame: np.ndarray) -> np.ndarray:
    """Mask of the boxes (N, 7) whose centre is closer to the ego than their class's range: the
    devkit's ``ego_dist < class_range``, ``ego_dist`` the ground-plane norm of the centre in
    ``ego_frame`` (its boxes' frame -> global axes, ego at the origin)."""
    centres = boxes[:, :3] @ ego_frame[:3, :3].T + ego_frame[:3, 3]
    return np.linalg.norm(centres[:, :2], axis=1) < ranges[labels]


def in_bike_rack(boxes: np.ndarray, racks: np.ndarray) -> np.ndarray:
    """Mask of the boxes (N, 7) whose centre is inside any of the racks (R, 4, 4: boxes' frame
    -> the rack's box as the cube |x|, |y|, |z| <= 1/2), faces included as in the devkit's
    ``points_in_box``."""
    local = boxes[:, :3] @ racks[:, :3, :3].transpose(0, 2, 1) + racks[:, None, :3, 3]  # (R, N, 3)
    return (np.abs(local) <= 0.5).all(axis=-1).any(axis=0)


def check_prediction_count(count: int) -> None:
    """Refuse a sample with more predictions than the devkit accepts (its ``load_prediction``
    asserts rather than keeping the best, so neither do we)."""
    if count > MAX_PREDICTIONS_PER_SAMPLE:
        raise ValueError(
            f"{count} predictions in one sample: the nuScenes detection evaluation accepts at most "
            f"{MAX_PREDICTIONS_PER_SAMPLE} per sample (the devkit's max_boxes_per_sample); keep the best "
            f"{MAX_PREDICTIONS_PER_SAMPLE} or fewer (model.head.max_detections)"
        )


def mean_over_classes(errors: np.ndarray) -> np.ndarray:
    """Per metric, the mean of the classes' errors (C, M) that are defined; nan if none is."""
    defined = ~np.isnan(errors)
    total = np.where(defined, errors, 0.0).sum(axis=0)
    count = defined.sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def detection_score(mean_ap: float, mean_errors: np.ndarray) -> float:
    """NDS from mAP and the mean true-positive errors, as ``DetectionMetrics.nd_score``."""
    scores = np.where(np.isnan(mean_errors), 0.0, 1.0 - np.minimum(1.0, mean_errors))
    return float(MEAN_AP_WEIGHT * mean_ap + scores.sum()) / (MEAN_AP_WEIGHT + len(mean_errors))


class CentreDistanceMAP(Metric):
    """The mAP above (``compute``), with the true-positive errors and NDS, accumulated over
    batches (predictions are matched within their sample when they arrive; the ranking over
    samples happens when the results are read).

    ``update(preds, targets)`` takes one dict per sample: predictions with ``boxes`` (P, 7:
    x, y, z, l, w, h, yaw; metres and radians), ``scores`` (P,), ``labels`` (P,); targets with
    ``boxes`` (G, 7) and ``labels`` (G,). ``class_names`` (optional) brings the devkit's rules
    for its classes ``barrier`` and ``traffic_cone``; other names, or none, have no such rule.
    ``class_ranges`` (optional, metres per class) drops boxes of both sides at or beyond their
    class's range from the ego, as the devkit does; the targets then carry ``ego_frame`` (4, 4).
    A target with ``bike_racks`` (R, 4, 4) drops the bicycles and motorcycles (by
    ``class_names``) of both sides whose centre is in one of them. A sample with more than
    :data:`MAX_PREDICTIONS_PER_SAMPLE` predictions is refused (``ValueError``), as the devkit does.
    """

    full_state_update = False

    def __init__(
        self,
        num_classes: int,
        thresholds: Sequence[float] = DISTANCE_THRESHOLDS,
        *,
        class_names: Sequence[str] | None = None,
        tp_threshold: float = TP_DISTANCE_THRESHOLD,
        class_ranges: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(f"class_names: {len(class_names)} names for num_classes={num_classes}")
        if class_ranges is not None and len(class_ranges) != num_classes:
            raise ValueError(f"class_ranges: {len(class_ranges)} ranges for num_classes={num_classes}")
        self.class_ranges = None if class_ranges is None else np.asarray(class_ranges, dtype=np.float64)
        self.num_classes = num_classes
        self.thresholds = tuple(thresholds)
        self.class_names = tuple(class_names) if class_names is not None else (None,) * num_classes
        self.tp_threshold = tp_threshold
        self.parked_classes = np.array([name in BIKE_RACK_CLASSES for name in self.class_names])
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")
        self.add_state("true_positives", default=[], dist_reduce_fx="cat")
        self.add_state("box_errors", default=[], dist_reduce_fx="cat")  # ATE, ASE, AOE at tp_threshold; nan: no match
        self.add_state("num_gt", default=torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    @staticmethod
    def _boxes(item: dict[str, Tensor], what: str) -> np.ndarray:
        boxes = item.get("boxes")
        if boxes is None or boxes.ndim != 2 or boxes.shape[1] != 7:
            shape = None if boxes is None else tuple(boxes.shape)
            raise ValueError(f"{what}['boxes'] must be (N, 7: x, y, z, l, w, h, yaw), got {shape}")
        return boxes.detach().cpu().double().numpy()

    def _evaluated(self, boxes: np.ndarray, labels: np.ndarray, target: dict[str, Tensor]) -> np.ndarray:
        """Mask of one side's boxes of a sample that the devkit's ``filter_eval_boxes`` keeps:
        within their class's range (with ``class_ranges``), not a two-wheeler in a rack."""
        labels = labels.astype(np.int64)
        kept = np.ones(len(boxes), dtype=bool)
        if self.class_ranges is not None:
            ego_frame = target["ego_frame"].detach().cpu().double().numpy()
            kept &= within_range(boxes, labels, self.class_ranges, ego_frame)
        racks = target.get("bike_racks")
        if racks is not None and len(racks):
            kept &= ~(self.parked_classes[labels] & in_bike_rack(boxes, racks.detach().cpu().double().numpy()))
        return kept

    def update(self, preds: Sequence[dict[str, Tensor]], targets: Sequence[dict[str, Tensor]]) -> None:
        if len(preds) != len(targets):
            raise ValueError(f"{len(preds)} predictions for {len(targets)} samples")
        for pred, target in zip(preds, targets, strict=True):
            p_box, g_box = self._boxes(pred, "prediction"), self._boxes(target, "target")
            p_score, p_label = (pred[k].detach().cpu().double().numpy() for k in ("scores", "labels"))
            g_label = target["labels"].detach().cpu().numpy()
            check_prediction_count(len(p_score))  # the devkit counts a sample's boxes before filtering them
            kept = self._evaluated(p_box, p_label, target)
            p_box, p_score, p_label = p_box[kept], p_score[kept], p_label[kept]
            kept = self._evaluated(g_box, g_label, target)
            g_box, g_label = g_box[kept], g_label[kept]
            tp = np.zeros((len(p_score), len(self.thresholds)), dtype=bool)
            errors = np.full((len(p_score), len(MEASURED)), np.nan)
            for c, name in enumerate(self.class_names):
                mine, theirs = p_label == c, g_box[g_label == c]
                tp[mine] = match(p_box[mine], p_score[mine], theirs, self.thresholds)
                matched = assign(p_box[mine], p_score[mine], theirs, self.tp_threshold)
                found = np.flatnonzero(mine)[matched >= 0]
                period = np.pi if name in HALF_TURN_CLASSES else 2 * np.pi
                errors[found] = box_errors(p_box[found], theirs[matched[matched >= 0]], period)
            self.scores.append(torch.as_tensor(p_score, device=self.device))
            self.labels.append(torch.as_tensor(p_label, dtype=torch.long, device=self.device))
            self.true_positives.append(torch.as_tensor(tp, device=self.device))
            self.box_errors.append(torch.as_tensor(errors, device=self.device))
            self.num_gt += torch.bincount(torch.as_tensor(g_label, dtype=torch.long), minlength=self.num_classes).to(
                self.num_gt.device
            )

    def _accumulated(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Scores, labels, true-positive flags, box errors of all predictions; num_gt per class."""
        # A list of per-sample tensors, or one tensor once synchronised across processes.
        cat = lambda items, empty: dim_zero_cat(items).cpu().numpy() if len(items) else empty  # noqa: E731
        return (
            cat(self.scores, np.zeros(0)),
            cat(self.labels, np.zeros(0, dtype=np.int64)),
            cat(self.true_positives, np.zeros((0, len(self.thresholds)), dtype=bool)),
            cat(self.box_errors, np.zeros((0, len(MEASURED)))),
            self.num_gt.cpu().numpy(),
        )

    def average_precisions(self) -> np.ndarray:
        """AP (num_classes, num_thresholds) of everything accumulated."""
        scores, labels, tp, _, num_gt = self._accumulated()
        return np.array(
            [
                [average_precision(scores[labels == c], tp[labels == c, t], int(num_gt[c])) for t in range(tp.shape[1])]
                for c in range(self.num_classes)
            ]
        )

    def true_positive_errors(self) -> np.ndarray:
        """Errors (num_classes, 5: ATE, ASE, AOE, AVE, AAE) per class; nan where the devkit
        leaves one undefined; AVE and AAE (not predicted) are 1."""
        scores, labels, _, errors, num_gt = self._accumulated()
        table = np.ones((self.num_classes, len(TP_METRICS)))
        for c, name in enumerate(self.class_names):
            table[c, : len(MEASURED)] = true_positive_error(scores[labels == c], errors[labels == c], int(num_gt[c]))
            for metric in UNDEFINED_ERRORS.get(name, ()):
                table[c, TP_METRICS.index(metric)] = np.nan
        return table

    def summary(self) -> dict[str, float]:
        """``map`` and ``nds`` (fractions), the mean errors ``ate`` (m), ``ase`` (1 - IoU),
        ``aoe`` (rad) and the not predicted ``ave`` and ``aae`` (1)."""
        mean_ap = float(self.average_precisions().mean())
        mean_errors = mean_over_classes(self.true_positive_errors())
        errors = {name: float(value) for name, value in zip(TP_METRICS, mean_errors, strict=True)}
        return {"map": mean_ap, "nds": detection_score(mean_ap, mean_errors), **errors}

    def compute(self) -> Tensor:
        return torch.tensor(float(self.average_precisions().mean()))
