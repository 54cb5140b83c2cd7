"""The devkit's class ranges and bike-rack filter in the nuscenes task: real nuScenes is
evaluated within the ranges (each sample's ``ego_frame`` measures the distance as the devkit
does) and without the two-wheelers in its ``bike_racks``; the generated scenes have neither."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pe_bench.harness.config import ConfigError, load_run_config
from pe_bench.tasks import get_task
from pe_bench.tasks.nuscenes.data import collate
from pe_bench.tasks.nuscenes.devkit import ego_frame
from pe_bench.tasks.nuscenes.synthetic import SceneConfig, scene_dataset


class FixedDetections(nn.Module):
    """``detect`` returns the same detections for every batch."""

    def __init__(self, detections: list[dict]) -> None:
        super().__init__()
        self.detections = detections

    def detect(self, batch: dict) -> list[dict]:
        return self.detections


def box(x: float, y: float) -> list[float]:
    return [x, y, 0.0, 4.0, 2.0, 1.5, 0.0]


def validated(task, detections, batch):
    module = task.lightning_module(FixedDetections(detections))
    with pytest.warns(UserWarning, match="self.log"):  # no trainer here; the metric still updates
        module.validation_step(batch, 0)
    return module.val_map


def test_real_nuscenes_is_evaluated_within_the_devkits_class_ranges():
    task = get_task("nuscenes")(load_run_config("nuscenes", "paper"))
    assert task.class_ranges() == [50, 50, 50, 50, 50, 30, 40, 40, 40, 30]  # car ... barrier ... traffic_cone
    car, barrier = task.data.classes.index("car"), task.data.classes.index("barrier")
    # A car and a barrier 45 m ahead, both found: the barrier (30 m) is out of the evaluation.
    boxes, labels = torch.tensor([box(45, 0), box(0, 45)]), torch.tensor([car, barrier])
    detections = [{"boxes": boxes, "scores": torch.tensor([0.9, 0.8]), "labels": labels}]
    batch = {"boxes": [boxes], "labels": [labels], "ego_frame": torch.eye(4, dtype=torch.float64)[None]}
    metric = validated(task, detections, batch)
    assert metric.num_gt[car] == 1 and metric.num_gt[barrier] == 0
    assert metric.average_precisions()[car] == pytest.approx(np.ones(4))


def test_real_nuscenes_drops_the_two_wheelers_in_its_bicycle_racks():
    task = get_task("nuscenes")(load_run_config("nuscenes", "paper"))
    car, bicycle = task.data.classes.index("car"), task.data.classes.index("bicycle")
    # A 2 m rack ahead at (10, 0): the bicycle in it and the one found there are not scored; the car is.
    rack = torch.diag(torch.tensor([0.5, 0.5, 0.5, 1.0], dtype=torch.float64))
    rack[0, 3] = -5.0
    boxes, labels = torch.tensor([box(10, 0), box(10, 0.5), box(0, 10)]), torch.tensor([bicycle, car, bicycle])
    detections = [{"boxes": boxes, "scores": torch.tensor([0.9, 0.8, 0.7]), "labels": labels}]
    batch = {"boxes": [boxes], "labels": [labels], "ego_frame": torch.eye(4, dtype=torch.float64)[None],
             "bike_racks": [rack[None]]}  # fmt: skip
    metric = validated(task, detections, batch)
    assert metric.num_gt[car] == 1 and metric.num_gt[bicycle] == 1 and len(metric.scores[0]) == 2
    assert metric.average_precisions()[bicycle] == pytest.approx(np.ones(4))


def test_the_generated_scenes_count_every_box():
    task = get_task("nuscenes")(load_run_config("nuscenes", "tiny"))
    assert task.class_ranges() is None
    boxes, labels = torch.tensor([box(0, 80)]), torch.tensor([0])
    detections = [{"boxes": boxes, "scores": torch.tensor([0.9]), "labels": labels}]
    metric = validated(task, detections, {"boxes": [boxes], "labels": [labels]})
    assert metric.class_ranges is None and metric.num_gt[0] == 1


def test_other_classes_have_no_devkit_range_on_real_nuscenes():
    task = get_task("nuscenes")(load_run_config("nuscenes", "paper", {"data": {"classes": ["car", "robot"]}}))
    with pytest.raises(ConfigError, match=r"\['robot'\] are not nuScenes detection classes"):
        task.class_ranges()


def sample(ego: bool, racks: int = 0) -> dict:
    out = {"points": torch.zeros(3, 5), "images": torch.zeros(6, 3, 8, 8), "boxes": torch.zeros(0, 7),
           "intrinsics": torch.eye(3).repeat(6, 1, 1), "cam_to_ego": torch.eye(4).repeat(6, 1, 1),
           "labels": torch.zeros(0)}  # fmt: skip
    real = {"ego_frame": torch.eye(4, dtype=torch.float64), "bike_racks": torch.eye(4).repeat(racks, 1, 1)}
    return out | (real if ego else {})


def test_only_real_samples_bring_an_ego_frame_and_bicycle_racks_into_the_batch():
    batch = collate([sample(True, racks=2), sample(True)])
    assert batch["ego_frame"].shape == (2, 4, 4)
    assert [r.shape for r in batch["bike_racks"]] == [(2, 4, 4), (0, 4, 4)]  # one list entry per sample
    assert not {"ego_frame", "bike_racks"} & set(collate([sample(False), sample(False)]))


def test_the_generated_scenes_have_no_bicycle_racks():
    (scene,) = scene_dataset(SceneConfig(), ["red", "green", "blue"], (64, 32), 1, 0)
    assert "bike_racks" not in scene and "ego_frame" not in scene


def test_the_ego_frame_gives_the_devkits_ego_translation():
    pytest.importorskip("pyquaternion", reason="nuscenes-devkit's dependencies are not installed")
    from nuscenes.utils.geometry_utils import transform_matrix
    from pyquaternion import Quaternion

    # LIDAR_TOP's mounting (turned a quarter about z, slightly tilted) and an ego pose far from the origin.
    lidar_to_ego = transform_matrix([0.94, 0.0, 1.84], Quaternion(axis=[0.01, 0.02, 1.0], angle=-np.pi / 2))
    ego_pose = {"translation": [411.3, 1180.9, 0.0], "rotation": Quaternion(axis=[0, 0, 1], angle=2.1)}
    ego_to_global = transform_matrix(ego_pose["translation"], ego_pose["rotation"])
    centre = np.array([12.0, -30.0, 0.5, 1.0])  # a box centre in the LiDAR frame
    # add_center_dist: the box's global translation minus the ego pose's translation.
    expected = (ego_to_global @ lidar_to_ego @ centre)[:3] - np.array(ego_pose["translation"])
    np.testing.assert_allclose((ego_frame(lidar_to_ego, ego_to_global) @ centre)[:3], expected, atol=1e-9)
