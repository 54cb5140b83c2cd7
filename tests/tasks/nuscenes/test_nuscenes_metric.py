"""The centre-distance mAP, the true-positive errors and NDS on hand-made cases, and against the
nuscenes-devkit where it is installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_bench.tasks.nuscenes.metric import (
    DEVKIT_CLASS_RANGES,
    MAX_PREDICTIONS_PER_SAMPLE,
    CentreDistanceMAP,
    average_precision,
    in_bike_rack,
    match,
)

THRESHOLDS = (0.5, 1.0, 2.0, 4.0)


def boxes(xy, sizes=None, yaws=None):
    """(N, 7) boxes at ground-plane centres ``xy``: z 0, sizes (l, w, h) 1 m and yaw 0 unless given."""
    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    size = np.ones((len(xy), 3)) if sizes is None else np.asarray(sizes, dtype=np.float64).reshape(-1, 3)
    yaw = np.zeros((len(xy), 1)) if yaws is None else np.asarray(yaws, dtype=np.float64).reshape(-1, 1)
    return torch.from_numpy(np.concatenate([xy, np.zeros((len(xy), 1)), size, yaw], axis=1))


def pred(xy, scores, labels, sizes=None, yaws=None):
    return {"boxes": boxes(xy, sizes, yaws), "scores": torch.tensor(scores, dtype=torch.float64),
            "labels": torch.tensor(labels)}  # fmt: skip


def gt(xy, labels, sizes=None, yaws=None):
    return {"boxes": boxes(xy, sizes, yaws), "labels": torch.tensor(labels)}


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


def summary(preds, targets, class_names):
    metric = CentreDistanceMAP(len(class_names), class_names=class_names)
    metric.update(preds, targets)
    return metric.true_positive_errors(), metric.summary()


def test_exact_boxes_have_no_true_positive_error_and_nds_08():
    sizes, yaws = [[4.0, 2.0, 1.5], [0.8, 0.6, 1.7]], [0.3, -2.0]
    errors, result = summary([pred([[1, 2], [5, 5]], [0.9, 0.8], [0, 1], sizes, yaws)],
                             [gt([[1, 2], [5, 5]], [0, 1], sizes, yaws)], ["red", "green"])  # fmt: skip
    np.testing.assert_allclose(errors, [[0, 0, 0, 1, 1]] * 2, atol=1e-12)
    # 5 mAP + 3 perfect TP scores + 2 not predicted, over 10.
    assert result["map"] == pytest.approx(1.0) and result["nds"] == pytest.approx(0.8)
    assert result["ave"] == result["aae"] == 1.0


def test_a_quarter_turn_is_an_aoe_of_pi_over_2_and_a_box_twice_as_long_an_ase_of_05():
    quarter_turn = pred([[0, 0]], [0.9], [0], yaws=[np.pi / 2 + 0.1])
    errors, result = summary([quarter_turn], [gt([[0, 0]], [0], yaws=[0.1])], ["a"])
    assert errors[0, :3] == pytest.approx([0.0, 0.0, np.pi / 2]) and result["aoe"] == pytest.approx(np.pi / 2)
    twice_as_long = pred([[0, 0]], [0.9], [0], sizes=[[8, 2, 1.5]])
    errors, _ = summary([twice_as_long], [gt([[0, 0]], [0], sizes=[[4, 2, 1.5]])], ["a"])
    assert errors[0, :3] == pytest.approx([0.0, 0.5, 0.0])


def test_ate_and_nds_of_a_centre_off_by_075_m():
    errors, result = summary([pred([[0.75, 0]], [0.5], [0])], [gt([[0, 0]], [0])], ["a"])
    assert errors[0, 0] == pytest.approx(0.75)
    # mAP 0.75 (missed at 0.5 m only); TP scores 0.25 + 1 + 1 + 0 + 0.
    assert result["nds"] == pytest.approx((5 * 0.75 + 2.25) / 10)


def test_a_half_turn_costs_a_car_pi_and_a_barrier_nothing():
    names = ["car", "barrier"]
    errors, _ = summary([pred([[0, 0], [5, 5]], [0.9, 0.8], [0, 1], yaws=[np.pi, np.pi])],
                        [gt([[0, 0], [5, 5]], [0, 1], yaws=[0, 0])], names)  # fmt: skip
    assert errors[0, 2] == pytest.approx(np.pi) and errors[1, 2] == pytest.approx(0.0)
    assert np.isnan(errors[1, 3:]).all() and (errors[0, 3:] == 1.0).all()  # the devkit has no AVE/AAE for barriers


def test_the_devkits_undefined_errors_are_left_out_of_the_mean():
    names = ["car", "traffic_cone"]
    errors, result = summary([pred([[0, 0], [5, 5]], [0.9, 0.8], [0, 1], yaws=[0.5, 3.0])],
                             [gt([[0, 0], [5, 5]], [0, 1], yaws=[0, 0])], names)  # fmt: skip
    assert np.isnan(errors[1, 2:]).all() and not np.isnan(errors[1, :2]).any()
    assert result["aoe"] == pytest.approx(0.5)  # the car's only: the cone's heading does not count


def test_a_class_not_found_beyond_recall_01_has_every_error_1():
    # One of 20 boxes found: recall 0.05 never passes the 0.1 floor that the errors are read above.
    targets = [gt([[10.0 * i, 0] for i in range(20)], [0] * 20)]
    errors, _ = summary([pred([[0, 0]], [0.9], [0])], targets, ["a"])
    assert errors[0].tolist() == [1.0] * 5
    errors, _ = summary([pred([[9, 9]], [0.9], [0])], [gt([[0, 0]], [0])], ["a"])  # no match at all
    assert errors[0].tolist() == [1.0] * 5


def test_boxes_of_the_wrong_shape_are_refused():
    metric = CentreDistanceMAP(1)
    bad = {"centres": torch.zeros(1, 2), "scores": torch.ones(1), "labels": torch.zeros(1, dtype=torch.long)}
    with pytest.raises(ValueError, match=r"prediction\['boxes'\] must be \(N, 7"):
        metric.update([bad], [gt([[0, 0]], [0])])
    with pytest.raises(ValueError, match="class_names: 2 names for num_classes=1"):
        CentreDistanceMAP(1, class_names=["a", "b"])


def random_case(rng: np.random.Generator, samples: int, classes: int, spread: float = 20.0):
    """Boxes with random sizes and headings within ``spread`` m on x and y; predictions jittered
    in centre, size and heading (some turned half round), plus false positives and wrong labels."""
    preds, targets = [], []
    for _ in range(samples):
        count = rng.integers(0, 8)
        xy = rng.uniform(-spread, spread, (count, 2))
        sizes = rng.uniform(0.3, 5.0, (count, 3))
        yaws = rng.uniform(-np.pi, np.pi, count)
        labels = rng.integers(0, classes, count)
        p_xy = np.concatenate([xy + rng.normal(0, 1.0, xy.shape), rng.uniform(-spread, spread, (4, 2))])
        p_sizes = np.concatenate([sizes * np.exp(rng.normal(0, 0.3, sizes.shape)), rng.uniform(0.3, 5.0, (4, 3))])
        p_yaws = np.concatenate([yaws + rng.normal(0, 0.4, count) + np.pi * (rng.random(count) < 0.3),
                                 rng.uniform(-np.pi, np.pi, 4)])  # fmt: skip
        guesses = np.concatenate([labels, rng.integers(0, classes, 4)])
        flip = rng.random(len(guesses)) < 0.2
        guesses[flip] = rng.integers(0, classes, int(flip.sum()))
        scores = np.round(rng.random(len(guesses)), 1)  # coarse: many ties across and within samples
        preds.append(pred(p_xy, scores, guesses, p_sizes, p_yaws))
        targets.append(gt(xy, labels, sizes, yaws))
    return preds, targets


class Annotations:
    """The two tables that the devkit's ``filter_eval_boxes`` reads beyond its distance and point
    filters (and that :func:`.devkit.bike_racks` reads): each sample's annotations, here the
    ``sample_annotation`` records in ``annotations`` (sample token -> records; none if absent)."""

    def __init__(self, annotations: dict[str, list[dict]] | None = None) -> None:
        self.annotations = annotations or {}

    def get(self, table: str, token: str) -> dict:
        if table == "sample":
            return {"anns": [f"{token}/{i}" for i in range(len(self.annotations.get(token, [])))]}
        assert table == "sample_annotation"
        sample, index = token.split("/")
        return self.annotations[sample][int(index)]


def devkit_metrics(preds, targets, names, ego_frames=None, annotations=None):
    """The devkit's ``DetectionEval.evaluate`` (matching, AP, TP errors with its nan rules, NDS)
    on our boxes: predictions without velocity (nan) or attribute, as our model. With
    ``ego_frames`` (one (4, 4) per sample: box frame -> global axes, ego at the origin) or
    ``annotations`` (an :class:`Annotations`, in the boxes' frame), the devkit's loading steps
    first: ``add_center_dist``'s ego translation (none without frames), then
    ``filter_eval_boxes`` with the config's class ranges and the annotations' bicycle racks."""
    pytest.importorskip("nuscenes.eval.detection.evaluate", reason="nuscenes-devkit is not installed")
    from nuscenes.eval.common.config import config_factory
    from nuscenes.eval.common.data_classes import EvalBoxes
    from nuscenes.eval.common.loaders import filter_eval_boxes
    from nuscenes.eval.detection.data_classes import DetectionBox
    from nuscenes.eval.detection.evaluate import DetectionEval

    attribute = {"car": "vehicle.parked", "pedestrian": "pedestrian.standing"}  # barrier, traffic_cone: none

    def box(sample, row, label, score=None, frame=None):
        x, y, z, length, width, height, yaw = (float(v) for v in row)
        name = names[int(label)]
        offset = (0.0, 0.0, 0.0) if frame is None else tuple(float(v) for v in frame[:3, :3] @ [x, y, z] + frame[:3, 3])
        return DetectionBox(
            sample_token=sample, translation=(x, y, z), size=(width, length, height),  # the devkit's w, l, h
            rotation=(float(np.cos(yaw / 2)), 0.0, 0.0, float(np.sin(yaw / 2))), detection_name=name,
            velocity=(0.0, 0.0) if score is None else (np.nan, np.nan),
            detection_score=-1.0 if score is None else score,
            attribute_name=attribute.get(name, "") if score is None else "", ego_translation=offset,
        )  # fmt: skip

    gt_boxes, pred_boxes = EvalBoxes(), EvalBoxes()
    for i, (p, t) in enumerate(zip(preds, targets, strict=True)):
        s, frame = f"s{i}", None if ego_frames is None else np.asarray(ego_frames[i], dtype=np.float64)
        gt_boxes.add_boxes(s, [box(s, row, y, frame=frame) for row, y in zip(t["boxes"], t["labels"], strict=True)])
        found = zip(p["boxes"], p["labels"], p["scores"], strict=True)
        pred_boxes.add_boxes(s, [box(s, row, y, float(score), frame) for row, y, score in found])
    cfg = config_factory("detection_cvpr_2019")
    if ego_frames is not None or annotations is not None:
        tables = annotations or Annotations()
        gt_boxes = filter_eval_boxes(tables, gt_boxes, cfg.class_range)
        pred_boxes = filter_eval_boxes(tables, pred_boxes, cfg.class_range)
    # The evaluation without its loading step (which needs the dataset on disk), over our classes only.
    evaluation = object.__new__(DetectionEval)
    evaluation.cfg, evaluation.verbose = cfg, False
    evaluation.cfg.class_names = list(names)
    evaluation.gt_boxes, evaluation.pred_boxes = gt_boxes, pred_boxes
    metrics, _ = evaluation.evaluate()
    return metrics


def test_equals_the_nuscenes_devkit():
    names = ["car", "pedestrian", "barrier", "traffic_cone"]
    preds, targets = random_case(np.random.default_rng(0), samples=40, classes=len(names))
    metrics = devkit_metrics(preds, targets, names)
    devkit_ap = np.array([[metrics.get_label_ap(name, th) for th in THRESHOLDS] for name in names])
    tp_metrics = ["trans_err", "scale_err", "orient_err", "vel_err", "attr_err"]
    devkit_tp = np.array([[metrics.get_label_tp(name, m) for m in tp_metrics] for name in names])

    metric = CentreDistanceMAP(len(names), class_names=names)
    metric.update(preds, targets)
    result = metric.summary()
    assert 0.05 < devkit_ap.mean() < 0.95  # a case with something to get wrong
    measured = devkit_tp[:, :3][~np.isnan(devkit_tp[:, :3])]
    assert len(measured) == 11 and (np.abs(measured - 1.0) > 1e-3).all()  # every error measured, none the fallback 1
    np.testing.assert_allclose(metric.average_precisions(), devkit_ap, atol=1e-6)
    np.testing.assert_allclose(metric.true_positive_errors(), devkit_tp, atol=1e-6)  # nan where the devkit's are
    mean_errors = [metrics.tp_errors[m] for m in tp_metrics]
    np.testing.assert_allclose([result[k] for k in ("ate", "ase", "aoe", "ave", "aae")], mean_errors, atol=1e-6)
    assert result["map"] == pytest.approx(metrics.mean_ap, abs=1e-6)
    assert result["nds"] == pytest.approx(metrics.nd_score, abs=1e-6)


def assert_same_as_the_devkit(metric, metrics, names):
    devkit_ap = np.array([[metrics.get_label_ap(name, th) for th in THRESHOLDS] for name in names])
    tp_metrics = ["trans_err", "scale_err", "orient_err", "vel_err", "attr_err"]
    devkit_tp = np.array([[metrics.get_label_tp(name, m) for m in tp_metrics] for name in names])
    np.testing.assert_allclose(metric.average_precisions(), devkit_ap, atol=1e-6)
    np.testing.assert_allclose(metric.true_positive_errors(), devkit_tp, atol=1e-6)
    result = metric.summary()
    assert result["map"] == pytest.approx(metrics.mean_ap, abs=1e-6)
    assert result["nds"] == pytest.approx(metrics.nd_score, abs=1e-6)


def ego_frame(yaw: float, offset) -> torch.Tensor:
    """Box frame -> global axes with the ego at the origin: a turn about z, then the shift from
    the sensor to the ego (as LIDAR_TOP's mounting, about 1 m ahead of the ego's origin)."""
    frame = torch.eye(4, dtype=torch.float64)
    frame[:2, :2] = torch.tensor([[np.cos(yaw), -np.sin(yaw)], [np.sin(yaw), np.cos(yaw)]])
    frame[:3, 3] = torch.tensor(offset, dtype=torch.float64)
    return frame


def test_the_class_ranges_are_the_devkits():
    pytest.importorskip("nuscenes.eval.common.config", reason="nuscenes-devkit is not installed")
    from nuscenes.eval.common.config import config_factory

    assert config_factory("detection_cvpr_2019").class_range == DEVKIT_CLASS_RANGES


def test_boxes_at_or_beyond_their_class_range_from_the_ego_count_on_neither_side():
    names, ranges = ["car", "pedestrian"], [DEVKIT_CLASS_RANGES["car"], DEVKIT_CLASS_RANGES["pedestrian"]]
    frame = ego_frame(0.0, (1.0, 0.0, 1.8))  # the sensor 1 m ahead of the ego's origin
    # A car and a pedestrian found 45 m ahead (46 m from the ego): the car is within its 50 m, the
    # pedestrian beyond its 40 m on both sides. A pedestrian 39.5 m ahead of the sensor is 40.5 m
    # from the ego: dropped, not missed. A false pedestrian 39.5 m to the side, 39.51 m from the
    # ego, stays: with no pedestrian left to find, pedestrians score 0.
    preds = [pred([[45, 0], [45, 0.5], [0, 39.5]], [0.9, 0.8, 0.7], [0, 1, 1])]
    targets = [gt([[45, 0], [45, 0.5], [39.5, 0]], [0, 1, 1]) | {"ego_frame": frame}]
    metric = CentreDistanceMAP(2, class_names=names, class_ranges=ranges)
    metric.update(preds, targets)
    np.testing.assert_allclose(metric.average_precisions(), [[1.0] * 4, [0.0] * 4])
    assert metric.num_gt.tolist() == [1, 0] and len(metric.scores[0]) == 2
    plain = CentreDistanceMAP(2, class_names=names)  # without ranges: the pedestrians are all there
    plain.update(preds, targets)
    assert plain.num_gt.tolist() == [1, 2] and 0 < plain.average_precisions()[1].mean() < 1


def test_with_class_ranges_equals_the_devkits_filter_and_evaluation():
    names = ["car", "pedestrian", "barrier", "traffic_cone"]
    rng = np.random.default_rng(1)
    preds, targets = random_case(rng, samples=40, classes=len(names), spread=60.0)
    frames = [ego_frame(rng.uniform(-np.pi, np.pi), (rng.uniform(0.5, 1.5), rng.uniform(-0.2, 0.2), 1.8))
              for _ in targets]  # fmt: skip
    metrics = devkit_metrics(preds, targets, names, frames)
    ranges = [DEVKIT_CLASS_RANGES[name] for name in names]
    metric = CentreDistanceMAP(len(names), class_names=names, class_ranges=ranges)
    metric.update(preds, [t | {"ego_frame": f} for t, f in zip(targets, frames, strict=True)])
    everything = sum(len(t["labels"]) for t in targets)
    assert 0 < int(metric.num_gt.sum()) < 0.8 * everything  # the ranges drop a good part of the boxes
    assert 0.05 < metrics.mean_ap < 0.95
    assert_same_as_the_devkit(metric, metrics, names)


def rack(frame_xyz, size, yaw: float = 0.0) -> torch.Tensor:
    """A rack's map from the boxes' frame to its unit cube: centred at ``frame_xyz``, sides
    ``size`` (l, w, h), turned ``yaw`` about z."""
    return torch.linalg.inv(ego_frame(yaw, frame_xyz) @ torch.diag(torch.tensor([*size, 1.0], dtype=torch.float64)))


def test_bicycles_and_motorcycles_in_a_bicycle_rack_count_on_neither_side():
    names = ["car", "bicycle", "motorcycle"]
    # A rack 2 m across at the origin, and one raised 2 m over (5, 0), clear of the boxes there.
    racks = torch.stack([rack((0.0, 0.0, 0.0), (2.0, 2.0, 2.0)), rack((5.0, 0.0, 3.0), (2.0, 2.0, 2.0))])
    # In the rack: a bicycle (found), a motorcycle on its face (x = 1: inside, as the devkit's
    # test), a car (kept: only two-wheelers are dropped). Under the raised rack: a bicycle, kept.
    targets = [gt([[0, 0], [1, 0], [0, 0.5], [5, 0]], [1, 2, 0, 1]) | {"bike_racks": racks}]
    preds = [pred([[0.1, 0], [5, 0], [0, 0.5], [-0.5, -0.5]], [0.9, 0.8, 0.7, 0.6], [1, 1, 0, 2])]
    metric = CentreDistanceMAP(3, class_names=names)
    metric.update(preds, targets)
    assert metric.num_gt.tolist() == [1, 1, 0] and metric.scores[0].tolist() == [0.8, 0.7]
    np.testing.assert_allclose(metric.average_precisions(), [[1.0] * 4, [1.0] * 4, [0.0] * 4])
    unnamed = CentreDistanceMAP(3)  # without class names no class is a two-wheeler: nothing dropped
    unnamed.update(preds, targets)
    assert unnamed.num_gt.tolist() == [1, 2, 1] and len(unnamed.scores[0]) == 4


def devkit_rack(rng: np.random.Generator, xy) -> dict:
    """A ``static_object.bicycle_rack`` annotation near ``xy``, slightly tilted, a third of them
    raised above the boxes (inside on the ground plane, not in 3-D)."""
    from pyquaternion import Quaternion

    z = 2.5 if rng.random() < 1 / 3 else 0.3
    tilt = Quaternion(axis=[1.0, rng.uniform(-1, 1), 0.0], angle=rng.uniform(-0.1, 0.1))
    rotation = Quaternion(axis=[0, 0, 1], angle=rng.uniform(-np.pi, np.pi)) * tilt
    size = [rng.uniform(0.8, 2.5), rng.uniform(1.5, 5.0), 1.5]  # w, l, h
    return {"category_name": "static_object.bicycle_rack", "translation": [*(xy + rng.normal(0, 0.3, 2)), z],
            "size": size, "rotation": list(rotation.elements)}  # fmt: skip


def rack_case(rng: np.random.Generator, samples: int, classes: int):
    """:func:`random_case` (10 m spread) with racks at about half the boxes and one elsewhere per
    sample, each beside an annotation of another category at the same place (not a rack)."""
    preds, targets = random_case(rng, samples, classes, spread=10.0)
    annotations = {}
    for i, target in enumerate(targets):
        xy = target["boxes"][:, :2].numpy()
        places = [*xy[rng.random(len(xy)) < 0.5], rng.uniform(-10, 10, 2)]
        racks = [devkit_rack(rng, place) for place in places]
        annotations[f"s{i}"] = [*racks, *({**r, "category_name": "movable_object.barrier"} for r in racks)]
    return preds, targets, Annotations(annotations)


def test_with_bicycle_racks_equals_the_devkits_filter_and_evaluation():
    pytest.importorskip("pyquaternion", reason="nuscenes-devkit's dependencies are not installed")
    from pe_bench.tasks.nuscenes.devkit import bike_racks

    names = ["car", "pedestrian", "bicycle", "motorcycle"]
    preds, targets, tables = rack_case(np.random.default_rng(2), samples=40, classes=len(names))
    metrics = devkit_metrics(preds, targets, names, annotations=tables)
    # Our reader's racks from the same tables; the boxes' frame is the annotations' here.
    racks = [torch.from_numpy(bike_racks(tables, tables.get("sample", f"s{i}"), np.eye(4))) for i in range(40)]
    metric = CentreDistanceMAP(len(names), class_names=names)
    metric.update(preds, [t | {"bike_racks": r} for t, r in zip(targets, racks, strict=True)])
    plain = CentreDistanceMAP(len(names), class_names=names)
    plain.update(preds, targets)
    dropped = (plain.num_gt - metric.num_gt).tolist()
    assert dropped[:2] == [0, 0] and min(dropped[2:]) > 0  # two-wheelers of the ground truth in racks
    assert sum(map(len, plain.scores)) - sum(map(len, metric.scores)) > 5  # and of the predictions
    cars = [t["boxes"][t["labels"] == 0].numpy() for t in targets]
    assert sum(in_bike_rack(c, r.numpy()).sum() for c, r in zip(cars, racks, strict=True)) > 0  # kept
    assert 0.05 < metrics.mean_ap < 0.95 and abs(plain.summary()["map"] - metrics.mean_ap) > 1e-3
    assert_same_as_the_devkit(metric, metrics, names)


def test_a_rack_in_a_samples_frame_contains_what_the_devkits_points_in_box_does():
    pytest.importorskip("pyquaternion", reason="nuscenes-devkit's dependencies are not installed")
    from nuscenes.utils.data_classes import Box
    from nuscenes.utils.geometry_utils import points_in_box, transform_matrix
    from pyquaternion import Quaternion

    from pe_bench.tasks.nuscenes.devkit import rack_frame

    rng = np.random.default_rng(3)
    rotation = Quaternion(axis=[0.1, -0.05, 1.0], angle=0.7)  # tilted: the full rotation matters
    annotation = {"translation": [411.3, 1180.9, 1.0], "size": [1.2, 3.5, 1.4], "rotation": list(rotation.elements)}
    sample_to_global = transform_matrix([410.0, 1178.0, 1.8], Quaternion(axis=[0.01, 0.02, 1.0], angle=2.1))
    frame = rack_frame(annotation["translation"], annotation["size"], annotation["rotation"],
                       np.linalg.inv(sample_to_global))  # fmt: skip
    centre = np.linalg.inv(sample_to_global) @ [*annotation["translation"], 1.0]
    points = centre[:3] + rng.uniform(-2.0, 2.0, (400, 3))  # in the sample's frame
    ours = in_bike_rack(np.concatenate([points, np.zeros((400, 4))], axis=1), frame[None])
    in_global = (sample_to_global @ np.concatenate([points, np.ones((400, 1))], axis=1).T)[:3]
    box = Box(annotation["translation"], annotation["size"], Quaternion(annotation["rotation"]))
    theirs = points_in_box(box, in_global)
    assert 20 < ours.sum() < 380 and (ours == theirs).all()


def test_more_than_500_predictions_in_a_sample_are_refused_as_by_the_devkit():
    def many(count):
        return pred(np.zeros((count, 2)), np.full(count, 0.5), np.zeros(count, dtype=np.int64))

    metric = CentreDistanceMAP(1)
    metric.update([many(MAX_PREDICTIONS_PER_SAMPLE)], [gt([[0, 0]], [0])])
    with pytest.raises(ValueError, match=r"501 predictions in one sample: .* at most 500 per sample .*max_detections"):
        metric.update([many(MAX_PREDICTIONS_PER_SAMPLE + 1)], [gt([[0, 0]], [0])])


def test_the_prediction_limit_is_the_devkits_and_the_devkit_refuses_more(tmp_path):
    pytest.importorskip("nuscenes.eval.common.loaders", reason="nuscenes-devkit is not installed")
    import json

    from nuscenes.eval.common.config import config_factory
    from nuscenes.eval.common.loaders import load_prediction
    from nuscenes.eval.detection.data_classes import DetectionBox

    assert config_factory("detection_cvpr_2019").max_boxes_per_sample == MAX_PREDICTIONS_PER_SAMPLE
    box = {"sample_token": "s0", "translation": [0.0, 0.0, 0.0], "size": [1.0, 1.0, 1.0], "rotation": [1.0, 0, 0, 0],
           "velocity": [0.0, 0.0], "detection_name": "car", "detection_score": 0.5, "attribute_name": ""}  # fmt: skip
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": {"s0": [box] * (MAX_PREDICTIONS_PER_SAMPLE + 1)}, "meta": {}}))
    with pytest.raises(AssertionError, match="Only <= 500 boxes per sample"):  # it refuses, keeps no best 500
        load_prediction(str(results), MAX_PREDICTIONS_PER_SAMPLE, DetectionBox)
