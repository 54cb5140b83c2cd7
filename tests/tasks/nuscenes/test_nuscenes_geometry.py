"""Calibration, ray casting and image lifting of the nuScenes family."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pe_bench.tasks.nuscenes.calibration import camera_pose, intrinsics, lift, pixel_rays, project
from pe_bench.tasks.nuscenes.synthetic import CLASS_COLOURS, SceneConfig, cast, generate_scene
from pe_bench.tasks.nuscenes.unitr import ImageLifter

CLASSES = list(CLASS_COLOURS)


def box_distance(points: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
    """Distance of points (N, 3) to the surface-or-inside of one box (7,)."""
    c, s = math.cos(box[6]), math.sin(box[6])
    local = points - box[:3]
    local = torch.stack([c * local[:, 0] + s * local[:, 1], -s * local[:, 0] + c * local[:, 1], local[:, 2]], -1)
    return (local.abs() - box[3:6] / 2).clamp_min(0).norm(dim=-1)


@pytest.mark.parametrize("yaw", [0.0, 0.7, -2.0])
def test_project_then_lift_returns_the_point(yaw):
    K = intrinsics(128, 48, 90.0)
    pose = camera_pose(yaw, 1.5)
    ahead = torch.tensor([math.cos(yaw), math.sin(yaw), 0.0])
    left = torch.tensor([-math.sin(yaw), math.cos(yaw), 0.0])
    points = 6.0 * ahead + torch.tensor([[0.0, 0.0, 1.5], [0.0, 0.0, 0.2], [0.0, 0.0, 2.4]]) + 1.3 * left
    pixels, depth = project(points, K, pose)
    assert torch.allclose(depth, torch.full((3,), 6.0), atol=1e-5)
    assert torch.allclose(lift(pixels, depth, K, pose), points, atol=1e-5)
    # At camera height, left of the optical axis: on the middle row, left of the centre column.
    assert pixels[0, 1] == pytest.approx(24.0, abs=1e-4) and pixels[0, 0] < 64.0
    assert pixels[1, 1] > 24.0 > pixels[2, 1]  # lower points are further down the image


def test_poses_are_rigid_and_batch():
    yaws = (0.0, 1.0, 2.5)
    poses = torch.stack([camera_pose(y, 1.0) for y in yaws])
    rotation = poses[:, :3, :3]
    assert torch.allclose(rotation @ rotation.transpose(1, 2), torch.eye(3).expand(3, 3, 3), atol=1e-6)
    assert torch.allclose(torch.linalg.det(rotation), torch.ones(3))
    K = intrinsics(64, 32, 70.0).expand(3, 3, 3)
    ahead = torch.tensor([[4 * math.cos(y), 4 * math.sin(y), 1.0] for y in yaws])
    points = torch.randn(3, 5, 3, generator=torch.Generator().manual_seed(0)) + ahead[:, None]  # in front of each
    pixels, depth = project(points, K, poses)
    assert (depth > 0).all()
    assert torch.allclose(lift(pixels, depth, K, poses), points, atol=1e-4)


def test_pixel_rays_pass_through_their_pixels():
    K, pose = intrinsics(16, 8, 60.0), camera_pose(0.3, 1.2)
    origin, directions = pixel_rays(16, 8, K, pose)
    pixels, depth = project(origin + 3.0 * directions, K, pose)
    v, u = torch.meshgrid(torch.arange(8) + 0.5, torch.arange(16) + 0.5, indexing="ij")
    assert torch.allclose(pixels, torch.stack([u.reshape(-1), v.reshape(-1)], -1), atol=1e-4)
    assert (depth > 0).all()


def test_rays_hit_the_nearest_surface():
    box = torch.tensor([[5.0, 0.0, 1.0, 2.0, 1.0, 2.0, 0.0]], dtype=torch.float64)
    origin = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    directions = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, -0.5]], dtype=torch.float64)
    directions = directions / directions.norm(dim=1, keepdim=True)
    distance, hit, normal = cast(origin, directions, box)
    assert distance[0].item() == pytest.approx(4.0) and hit[0] == 0
    assert torch.allclose(normal[0], torch.tensor([-1.0, 0.0, 0.0], dtype=torch.float64))
    assert torch.isinf(distance[1]) and hit[1] == -2  # horizontal ray past the box: nothing
    assert hit[2] == -1 and distance[2].item() == pytest.approx(math.sqrt(5.0))  # ground at 2 m


def test_scene_sensors_agree_and_lifting_lands_on_the_objects():
    cfg = SceneConfig()
    scene = generate_scene(cfg, CLASSES, (128, 48), np.random.default_rng(3))
    points, boxes = scene["points"], scene["boxes"]
    assert len(boxes) >= 2 and scene["images"].shape == (1, 3, 48, 128)
    on_box = torch.stack([box_distance(points[:, :3], b) for b in boxes]).min(0).values < 0.1
    ground = points[:, 2].abs() < 0.1
    assert (on_box | ground).float().mean() > 0.99  # every return lies on the geometry
    # An object's pixels show its class colour; the lifted patches over it lie on it.
    lifter = ImageLifter(patch_size=8, fallback_depth=10.0)
    lifted = lifter(points, torch.zeros(len(points), dtype=torch.long), scene["intrinsics"][None],
                    scene["cam_to_ego"][None], (48, 128))[0, 0]  # fmt: skip
    pixels, depth = project(boxes[:, :3], scene["intrinsics"][0], scene["cam_to_ego"][0])
    on_object = []
    for box, pixel, z in zip(boxes, pixels, depth, strict=True):
        row, col = int(pixel[1] // 8), int(pixel[0] // 8)
        assert z > 0
        on_object.append(box_distance(lifted[row, col][None], box).item() < 0.6)
        # Otherwise another object hides this one's centre: the patch is lifted onto the occluder.
        assert on_object[-1] or lifted[row, col, 0] < box[0] - 1.0
    assert sum(on_object) >= len(boxes) - 1
