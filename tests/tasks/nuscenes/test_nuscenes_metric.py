"""The centre-distance mAP on hand-made cases, and against the nuscenes-devkit where it is installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_bench.tasks.nuscenes.metric import CentreDistanceMAP, average_precision, match

THRESHOLDS = (0.5, 1.0, 2.0, 4.0)


def pred(xy, scores, labels):
    return {"centres": torch.tensor(xy, dtype=torch.float32).reshape(-1, 2),
            "scores": torch.tensor(scores, dtype=torch.float32), "labels": torch.tensor(labels)}  # fmt: skip


def gt(xy, labels):
    return {"centres": torch.tensor(xy, dtype=torch.float32).reshape(-1, 2), "labels": torch.tensor(labels)}


def mean_ap(preds, targets, num_classes):
    metric = CentreDistanceMAP(num_classes)
    metric.update(preds, targets)
    return metric.average_precisions(), float(metric.compute())


def test_exact_detections_score_one():
    aps, value = mean_ap([pred([[1, 2], [5, 5]], [0.9, 0.8], [0, 1])], [gt([[1, 2], [5, 5]], [0, 1])], 2)
    assert value == pytest.approx(1.0) and np.allclose(aps, 1.0)


def test_a_centre_off_by_075_m_misses_only_the_05_m_threshold():
    aps, value = mean_ap([pred([[0.75, 0]], [0.5], [0])], [gt([[0, 0]], [0])], 1)
    assert aps[0].tolist() == pytest.approx([0.0, 1.0, 1.0, 1.0]) and value == pytest.approx(0.75)


def test_one_of_three_found_gives_the_23_recall_points_up_to_one_third():
    # Recall reaches 1/3 at precision 1, then a false positive: the interpolated precision is 1
    # at recall 0.11 .. 0.33 (23 of the 90 points above 0.1) and 0 beyond.
    preds = [pred([[0, 0], [9, 9]], [0.9, 0.1], [0, 0])]
    aps, _ = mean_ap(preds, [gt([[0, 0], [20, 0], [0, 20]], [0, 0, 0])], 1)
    assert aps[0] == pytest.approx(np.full(4, 23 / 90))


def test_precision_is_clipped_at_01():
    # The only true positive is ranked behind 9 false positives: precision 0.1 at recall 1,
    # interpolated linearly from (0, 0); nothing exceeds the 0.1 floor by much.
    xy = [[50 + i, 0] for i in range(9)] + [[0, 0]]
    scores = [0.9 - 0.05 * i for i in range(9)] + [0.1]
    aps, _ = mean_ap([pred(xy, scores, [0] * 10)], [gt([[0, 0]], [0])], 1)
    assert aps[0] == pytest.approx(np.zeros(4))


def test_greedy_matching_takes_the_nearest_free_box_in_score_order():
    # A (higher score) takes the box at 0; B is then 2.9 m from the other box: a hit only at 4 m.
    boxes = np.array([[0.0, 0.0], [3.0, 0.0]])
    flags = match(np.array([[0.4, 0.0], [0.1, 0.0]]), np.array([0.9, 0.8]), boxes, THRESHOLDS)
    assert flags.tolist() == [[True] * 4, [False, False, False, True]]
    # A farther prediction never steals a box from a nearer one ranked before it.
    flags = match(np.array([[0.0, 0.0], [0.2, 0.0]]), np.array([0.9, 0.8]), np.array([[0.0, 0.0]]), THRESHOLDS)
    assert flags.tolist() == [[True] * 4, [False] * 4]


def test_classes_are_matched_separately_and_a_class_without_boxes_scores_zero():
    aps, value = mean_ap([pred([[0, 0]], [0.9], [1])], [gt([[0, 0]], [0])], 3)
    assert np.allclose(aps, 0.0) and value == 0.0
    aps, value = mean_ap([pred([[0, 0]], [0.9], [0])], [gt([[0, 0]], [0])], 3)
    assert np.allclose(aps[0], 1.0) and value == pytest.approx(1 / 3)


def test_samples_are_matched_within_themselves_and_accumulate_over_batches():
    metric = CentreDistanceMAP(1)
    metric.update([pred([[0, 0]], [0.9], [0])], [gt([[5, 5]], [0])])  # box of another sample is no match
    metric.update([pred([[5, 5]], [0.8], [0])], [gt([[0, 0]], [0])])
    assert np.allclose(metric.average_precisions(), 0.0)
    metric.update([pred([[3, 3]], [0.95], [0])], [gt([[3, 3]], [0])])
    assert average_precision(np.array([0.95]), np.array([True]), 1) == pytest.approx(1.0)
    assert 0.0 < float(metric.compute()) < 1.0


def random_case(rng: np.random.Generator, samples: int, classes: int):
    preds, targets = [], []
    for _ in range(samples):
        boxes = rng.uniform(-20, 20, (rng.integers(0, 8), 2))
        labels = rng.integers(0, classes, len(boxes))
        jittered = np.concatenate([boxes + rng.normal(0, 1.5, boxes.shape), rng.uniform(-20, 20, (4, 2))])
        guesses = np.concatenate([labels, rng.integers(0, classes, 4)])
        flip = rng.random(len(guesses)) < 0.2
        guesses[flip] = rng.integers(0, classes, int(flip.sum()))
        scores = np.round(rng.random(len(guesses)), 1)  # coarse: many ties across and within samples
        preds.append(pred(jittered, scores, guesses))
        targets.append(gt(boxes, labels))
    return preds, targets


def test_equals_the_nuscenes_devkit():
    algo = pytest.importorskip("nuscenes.eval.detection.algo", reason="nuscenes-devkit is not installed")
    from nuscenes.eval.common.data_classes import EvalBoxes
    from nuscenes.eval.common.utils import center_distance
    from nuscenes.eval.detection.data_classes import DetectionBox

    names = ["car", "pedestrian", "barrier"]
    preds, targets = random_case(np.random.default_rng(0), samples=30, classes=len(names))
    gt_boxes, pred_boxes = EvalBoxes(), EvalBoxes()

    def box(sample, xy, label, score=-1.0):
        return DetectionBox(
            sample_token=sample, translation=(float(xy[0]), float(xy[1]), 0.0), size=(1.0, 1.0, 1.0),
            rotation=(1.0, 0.0, 0.0, 0.0), detection_name=names[int(label)], detection_score=float(score),
        )  # fmt: skip

    for i, (p, t) in enumerate(zip(preds, targets, strict=True)):
        s = f"s{i}"
        gt_boxes.add_boxes(s, [box(s, xy, y) for xy, y in zip(t["centres"], t["labels"], strict=True)])
        found = zip(p["centres"], p["labels"], p["scores"], strict=True)
        pred_boxes.add_boxes(s, [box(s, xy, y, score) for xy, y, score in found])

    def devkit_ap(name, threshold):
        return algo.calc_ap(algo.accumulate(gt_boxes, pred_boxes, name, center_distance, threshold), 0.1, 0.1)

    devkit = np.array([[devkit_ap(name, th) for th in THRESHOLDS] for name in names])
    ours, _ = mean_ap(preds, targets, len(names))
    assert 0.05 < devkit.mean() < 0.95  # a case with something to get wrong
    np.testing.assert_allclose(ours, devkit, atol=1e-6)
