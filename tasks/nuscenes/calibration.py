"""Pinhole cameras in the ego frame: projection of 3-D points and lifting of pixels back to 3-D.

Frames (nuScenes' conventions): the ego/LiDAR frame has x forward, y left, z up; a camera
frame has x right, y down, z along the optical axis (OpenCV). A camera is its intrinsics
``K`` (3, 3) and its pose ``cam_to_ego`` (4, 4), with ``p_ego = R p_cam + t``. Pixel (u, v)
is (column, row), the centre of the top-left pixel at (0.5, 0.5). Every function broadcasts
over leading dimensions, so one call handles all views of a batch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def intrinsics(width: int, height: int, hfov_deg: float) -> Tensor:
    """K of a camera with square pixels, principal point at the image centre and the given
    horizontal field of view."""
    if not 0.0 < hfov_deg < 180.0:
        raise ValueError(f"camera hfov must be in (0, 180) degrees, got {hfov_deg}")
    focal = width / 2.0 / math.tan(math.radians(hfov_deg) / 2.0)
    return torch.tensor([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]])


def camera_pose(yaw: float, height: float) -> Tensor:
    """cam_to_ego of a level camera at (0, 0, height) looking along ego heading ``yaw`` (rad,
    counter-clockwise from +x)."""
    c, s = math.cos(yaw), math.sin(yaw)
    pose = torch.eye(4)
    # Columns: the camera's x (right), y (down) and z (forward) axes in the ego frame.
    pose[:3, :3] = torch.tensor([[s, 0.0, c], [-c, 0.0, s], [0.0, -1.0, 0.0]])
    pose[2, 3] = height
    return pose


def to_camera(points: Tensor, cam_to_ego: Tensor) -> Tensor:
    """(..., N, 3) ego points -> (..., N, 3) in the camera frame."""
    rotation, translation = cam_to_ego[..., :3, :3], cam_to_ego[..., :3, 3]
    return (points - translation.unsqueeze(-2)) @ rotation


def project(points: Tensor, K: Tensor, cam_to_ego: Tensor) -> tuple[Tensor, Tensor]:
    """(..., N, 3) ego points -> pixels (..., N, 2) and depth (..., N) along the optical axis.

    Points behind the camera (depth <= 0) get meaningless pixels: callers mask by depth.
    """
    cam = to_camera(points, cam_to_ego)
    depth = cam[..., 2]
    pixels = cam @ K.transpose(-1, -2)
    return pixels[..., :2] / depth.clamp_min(1e-6).unsqueeze(-1), depth


def lift(pixels: Tensor, depth: Tensor, K: Tensor, cam_to_ego: Tensor) -> Tensor:
    """Inverse of :func:`project`: pixels (..., N, 2) at ``depth`` (..., N) -> ego points (..., N, 3)."""
    homogeneous = torch.cat([pixels, torch.ones_like(pixels[..., :1])], dim=-1)
    cam = (homogeneous @ torch.linalg.inv(K).transpose(-1, -2)) * depth.unsqueeze(-1)
    return cam @ cam_to_ego[..., :3, :3].transpose(-1, -2) + cam_to_ego[..., :3, 3].unsqueeze(-2)


def pixel_rays(width: int, height: int, K: Tensor, cam_to_ego: Tensor) -> tuple[Tensor, Tensor]:
    """Origin (3,) and unit directions (height * width, 3), row-major, of the rays through
    every pixel centre, in the ego frame."""
    v, u = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    pixels = torch.stack([u.reshape(-1), v.reshape(-1)], dim=-1).to(K.dtype)
    far = lift(pixels, torch.ones(len(pixels), dtype=K.dtype), K, cam_to_ego)
    origin = cam_to_ego[:3, 3]
    directions = far - origin
    return origin, directions / directions.norm(dim=-1, keepdim=True)
