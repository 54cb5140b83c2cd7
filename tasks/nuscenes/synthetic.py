"""Generated driving scenes for the tiny profile: a LiDAR sweep and camera images of one scene.

A scene is flat ground (z = 0) with a few boxes standing on it at random headings. Both
sensors are ray-cast against the same geometry, so their calibration is consistent by
construction: the LiDAR (at ``lidar_height``) casts rings of beams and returns the first hit
(ground or box face) with range noise; each camera (pinhole, at ``camera_height``) casts one
ray per pixel and shades the first hit: ground grey, sky blue, box faces in their class's
colour under a fixed light.

The design makes both modalities necessary and positions the only way to join them:

* classes differ only in colour: their sizes come from one distribution and LiDAR returns
  the same intensity from every box, so the LiDAR alone cannot name a class;
* the images are small (an object spans one or two patches) and box sizes vary, so the
  camera alone locates an object only roughly in depth; the LiDAR locates it to centimetres;
* a LiDAR token carries no absolute position in its features, and several objects of
  different classes share every scene, so attaching the right colour to the right object
  needs the tokens' positions: without them (nopos) a token sees the scene's mix of colours.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from pe_bench.harness.config import Strict

from .calibration import camera_pose, intrinsics, pixel_rays

#: class name -> base colour (RGB in [0, 1]); the names say what tells the classes apart.
CLASS_COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.85, 0.15, 0.10),
    "green": (0.15, 0.70, 0.20),
    "blue": (0.15, 0.30, 0.90),
}
GROUND_COLOUR = (0.45, 0.45, 0.45)
SKY_COLOUR = (0.65, 0.78, 0.95)
LIGHT = (-0.4, 0.3, 0.87)  # direction towards the light (ego frame), for face shading


class SceneConfig(Strict):
    """How the tiny profile's scenes are generated (sizes in metres, angles in degrees)."""

    objects: tuple[int, int] = (3, 5)  # objects per scene, inclusive
    distance: tuple[float, float] = (4.0, 15.0)  # of object centres from the ego
    min_separation: float = 3.5  # between object centres (boxes never overlap)
    length: tuple[float, float] = (1.6, 3.0)
    width: tuple[float, float] = (1.0, 1.6)
    height: tuple[float, float] = (1.0, 1.8)
    brightness: tuple[float, float] = (0.7, 1.0)  # per-object factor on the class colour
    lidar_height: float = 1.8
    beams: int = 16
    elevation: tuple[float, float] = (-30.0, -1.0)  # of the lowest and highest beam
    azimuth: tuple[float, float] = (-50.0, 50.0)
    azimuth_step: float = 0.5
    range_noise: float = 0.02
    max_range: float = 40.0
    camera_height: float = 1.5
    camera_yaws: list[float] = [0.0]  # one camera per entry, level, at the ego
    hfov: float = 90.0
    pixel_noise: float = 0.03
    margin: float = 8.0  # degrees kept between objects and the edge of a camera's view
    # An object is annotated when both sensors see it (nuScenes drops boxes without LiDAR points).
    min_points: int = 5
    min_pixels: int = 16

    def check(self, classes: list[str]) -> None:
        unknown = [c for c in classes if c not in CLASS_COLOURS]
        if unknown:
            raise ValueError(
                f"data.classes: no colour for {unknown}; the generated scenes have {', '.join(CLASS_COLOURS)}"
            )
        if not 1 <= self.objects[0] <= self.objects[1]:
            raise ValueError(f"data.scenes.objects must be (min, max) with 1 <= min <= max, got {self.objects}")


def yaw_rotation(yaw: Tensor) -> Tensor:
    """(K,) yaw angles -> (K, 3, 3) rotations about z."""
    c, s = torch.cos(yaw), torch.sin(yaw)
    zero, one = torch.zeros_like(yaw), torch.ones_like(yaw)
    return torch.stack([c, -s, zero, s, c, zero, zero, zero, one], dim=-1).view(-1, 3, 3)


def cast(origin: Tensor, directions: Tensor, boxes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """First hits of rays (origin (3,), unit directions (R, 3)) on the ground plane z = 0 and
    on boxes (K, 7: x, y, z, l, w, h, yaw), by the slab method in each box's frame.

    Returns distance (R,) (inf: no hit), what was hit (R,) (-1 ground, -2 nothing, k box k)
    and the unit normal (R, 3) of the surface hit.
    """
    rays = len(directions)
    t_ground = torch.where(directions[:, 2] < 0, -origin[2] / directions[:, 2].clamp(max=-1e-12), torch.inf)
    best = t_ground
    hit = torch.where(torch.isfinite(t_ground), -1, -2)
    normal = torch.zeros(rays, 3, dtype=directions.dtype)
    normal[:, 2] = 1.0
    if len(boxes):
        rot = yaw_rotation(boxes[:, 6])  # box -> ego
        o_box = torch.einsum("kji,kj->ki", rot, origin - boxes[:, :3])  # (K, 3)
        d_box = torch.einsum("kji,rj->rki", rot, directions)  # (R, K, 3)
        half = boxes[:, 3:6] / 2
        inv = 1.0 / torch.where(d_box == 0, torch.full_like(d_box, 1e-12), d_box)
        t1, t2 = (-half - o_box) * inv, (half - o_box) * inv
        near, far = torch.minimum(t1, t2), torch.maximum(t1, t2)
        t_enter, axis = near.max(dim=-1)  # the slab entered last is the face hit
        t_exit = far.min(dim=-1).values
        t_box = torch.where((t_enter <= t_exit) & (t_enter > 0), t_enter, torch.inf)  # (R, K)
        t_min, k_min = t_box.min(dim=-1)
        closer = t_min < best
        best = torch.where(closer, t_min, best)
        hit = torch.where(closer, k_min, hit)
        rows = closer.nonzero(as_tuple=True)[0]
        k = k_min[rows]
        a = axis[rows, k]
        sign = -torch.sign(d_box[rows, k, a])
        local = torch.zeros(int(closer.sum()), 3, dtype=directions.dtype)
        local[torch.arange(len(k)), a] = sign
        normal[closer] = torch.einsum("nij,nj->ni", rot[k], local)
    return best, hit, normal


def sample_objects(cfg: SceneConfig, classes: list[str], rng: np.random.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Boxes (K, 7), labels (K,) and colours (K, 3) of one scene, all inside a camera's view."""
    count = int(rng.integers(cfg.objects[0], cfg.objects[1] + 1))
    half_view = math.radians(cfg.hfov / 2 - cfg.margin)
    centres: list[np.ndarray] = []
    for _ in range(200 * count):  # rejection sampling of well-separated centres
        if len(centres) == count:
            break
        yaw = math.radians(float(rng.choice(cfg.camera_yaws))) + rng.uniform(-half_view, half_view)
        dist = rng.uniform(*cfg.distance)
        c = np.array([dist * math.cos(yaw), dist * math.sin(yaw)])
        if all(np.linalg.norm(c - o) >= cfg.min_separation for o in centres):
            centres.append(c)
    k = len(centres)
    size = np.stack([rng.uniform(*cfg.length, k), rng.uniform(*cfg.width, k), rng.uniform(*cfg.height, k)], 1)
    xy = np.array(centres).reshape(k, 2)
    boxes = np.concatenate([xy, size[:, 2:] / 2, size, rng.uniform(-np.pi, np.pi, (k, 1))], axis=1)
    labels = rng.integers(0, len(classes), k)
    base = np.array([CLASS_COLOURS[classes[i]] for i in labels]).reshape(k, 3)
    colours = base * rng.uniform(*cfg.brightness, (k, 1))
    as_tensor = lambda a, t: torch.as_tensor(a, dtype=t)  # noqa: E731
    return as_tensor(boxes, torch.float64), as_tensor(labels, torch.long), as_tensor(colours, torch.float64)


def lidar_sweep(cfg: SceneConfig, boxes: Tensor, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    """(M, 4) points (x, y, z, intensity): beams x azimuths, first returns within range; and
    what each point hit (M,) (-1 ground, k box k)."""
    elevation = torch.deg2rad(torch.linspace(*cfg.elevation, cfg.beams, dtype=torch.float64))
    steps = int(round((cfg.azimuth[1] - cfg.azimuth[0]) / cfg.azimuth_step)) + 1
    azimuth = torch.deg2rad(torch.linspace(*cfg.azimuth, steps, dtype=torch.float64))
    el, az = torch.meshgrid(elevation, azimuth, indexing="ij")
    directions = torch.stack([el.cos() * az.cos(), el.cos() * az.sin(), el.sin()], dim=-1).view(-1, 3)
    origin = torch.tensor([0.0, 0.0, cfg.lidar_height], dtype=torch.float64)
    distance, hit, _ = cast(origin, directions, boxes)
    keep = distance < cfg.max_range
    distance = distance[keep] + torch.as_tensor(rng.normal(0.0, cfg.range_noise, int(keep.sum())))
    points = origin + directions[keep] * distance[:, None]
    # One reflectivity for every box: intensity must not tell the classes apart.
    intensity = torch.where(hit[keep] >= 0, 0.6, 0.2) + torch.as_tensor(rng.normal(0.0, 0.05, len(points)))
    return torch.cat([points, intensity[:, None]], dim=1).float(), hit[keep]


def render(
    cfg: SceneConfig,
    image_size: tuple[int, int],
    boxes: Tensor,
    colours: Tensor,
    K: Tensor,
    cam_to_ego: Tensor,
    rng: np.random.Generator,
) -> tuple[Tensor, Tensor]:
    """(3, H, W) image in [0, 1] of the scene seen by one camera, and what each pixel shows
    (H * W,) (-2 sky, -1 ground, k box k)."""
    width, height = image_size
    origin, directions = pixel_rays(width, height, K.double(), cam_to_ego.double())
    _, hit, normal = cast(origin, directions, boxes)
    light = torch.tensor(LIGHT, dtype=torch.float64)
    light = light / light.norm()
    shade = 0.35 + 0.65 * (normal @ light).clamp_min(0.0)
    image = torch.empty(len(directions), 3, dtype=torch.float64)
    image[hit == -2] = torch.tensor(SKY_COLOUR, dtype=torch.float64)
    image[hit == -1] = torch.tensor(GROUND_COLOUR, dtype=torch.float64)
    on_box = hit >= 0
    image[on_box] = colours[hit[on_box]] * shade[on_box, None]
    image = image + torch.as_tensor(rng.normal(0.0, cfg.pixel_noise, image.shape))
    return image.clamp(0.0, 1.0).T.reshape(3, height, width).float(), hit


def cameras(cfg: SceneConfig, image_size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Intrinsics (V, 3, 3) and poses (V, 4, 4) of the scene's cameras (image_size: width, height)."""
    K = intrinsics(*image_size, cfg.hfov)
    poses = [camera_pose(math.radians(yaw), cfg.camera_height) for yaw in cfg.camera_yaws]
    return K.expand(len(poses), 3, 3).clone(), torch.stack(poses)


def generate_scene(
    cfg: SceneConfig, classes: list[str], image_size: tuple[int, int], rng: np.random.Generator
) -> dict[str, Tensor]:
    """One sample: ``points`` (M, 4), ``images`` (V, 3, H, W), ``intrinsics`` (V, 3, 3),
    ``cam_to_ego`` (V, 4, 4), ``boxes`` (K, 7: x, y, z, l, w, h, yaw) and ``labels`` (K,).

    Boxes hidden from either sensor (fewer than ``min_points`` returns or ``min_pixels``
    pixels) stay in the scene but are not annotated: nothing can detect and classify them.
    """
    boxes, labels, colours = sample_objects(cfg, classes, rng)
    K, poses = cameras(cfg, image_size)
    points, point_hits = lidar_sweep(cfg, boxes, rng)
    views = [render(cfg, image_size, boxes, colours, K[v], poses[v], rng) for v in range(len(poses))]
    pixel_hits = torch.cat([hits for _, hits in views])
    count = lambda hits: torch.bincount(hits[hits >= 0], minlength=len(boxes))  # noqa: E731
    seen = (count(point_hits) >= cfg.min_points) & (count(pixel_hits) >= cfg.min_pixels)
    return {
        "points": points,
        "images": torch.stack([image for image, _ in views]),
        "intrinsics": K,
        "cam_to_ego": poses,
        "boxes": boxes[seen].float(),
        "labels": labels[seen],
    }


def scene_dataset(
    cfg: SceneConfig, classes: list[str], image_size: tuple[int, int], count: int, seed: int
) -> list[dict[str, Tensor]]:
    """``count`` scenes from one seed (every cell of a grid sees the same scenes)."""
    cfg.check(classes)
    rng = np.random.default_rng(seed)
    return [generate_scene(cfg, classes, image_size, rng) for _ in range(count)]
