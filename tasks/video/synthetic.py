"""Generated motion clips for the tiny ``ucf101`` profile (no download).

A clip is ``steps`` tubelets of ``tubelet`` frames on a ``grid`` x ``grid`` patch grid.
The moving objects (:mod:`.video_motion`) sit still inside a tubelet and jump from cell to
cell between tubelets, aligned to the patch grid: every tubelet token is then a clean
"object" or "background" patch whose content says nothing about the motion, and the class
can only be read from where and when the object tokens are. A static distractor of
another shape and pixel noise keep it from being trivial.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pe_bench.tasks._shared.motion import MOTIONS, MotionPath, motion_path, sample_motion


def _shapes(patch: int) -> tuple[np.ndarray, np.ndarray]:
    """A filled disk (the moving objects) and a ring (the distractor), patch x patch."""
    yy, xx = (np.mgrid[0:patch, 0:patch] + 0.5) / patch - 0.5
    radius = np.hypot(yy, xx)
    return (radius < 0.4).astype(np.float32), (np.abs(radius - 0.32) < 0.1).astype(np.float32)


def motion_clips(
    count: int,
    num_classes: int = len(MOTIONS),
    grid: int = 6,
    patch: int = 4,
    steps: int = 3,
    tubelet: int = 2,
    channels: int = 3,
    noise: float = 0.1,
    seed: int = 0,
    paths: frozenset[MotionPath] | None = None,
) -> tuple[Tensor, Tensor]:
    """(count, C, steps * tubelet, H, W) float clips and (count,) labels, balanced, deterministic;
    ``paths``: the disk paths allowed (None: every one), see :func:`split_paths`."""
    clips, labels, _ = motion_clips_with_paths(
        count, num_classes, grid, patch, steps, tubelet, channels, noise, seed, paths
    )
    return clips, labels


def motion_clips_with_paths(
    count: int,
    num_classes: int,
    grid: int,
    patch: int,
    steps: int,
    tubelet: int,
    channels: int,
    noise: float,
    seed: int,
    paths: frozenset[MotionPath] | None = None,
) -> tuple[Tensor, Tensor, list[MotionPath]]:
    """:func:`motion_clips` and each clip's disk path, the configuration its label depends on."""
    if not 1 <= num_classes <= len(MOTIONS):
        raise ValueError(f"num_classes must be 1..{len(MOTIONS)}, got {num_classes}")
    rng = np.random.default_rng(seed)
    disk, ring = _shapes(patch)
    side = grid * patch
    clips = rng.normal(0.0, noise, size=(count, channels, steps * tubelet, side, side)).astype(np.float32)
    labels = np.arange(count) % num_classes
    rng.shuffle(labels)
    sample_u = np.linspace(0.0, 1.0, steps)
    drawn = []
    for i, label in enumerate(labels):
        motion = sample_motion(int(label), grid, steps, rng, paths)
        drawn.append(motion_path(motion, steps))
        colour = rng.uniform(0.6, 1.0, size=(channels, 1, 1)).astype(np.float32)
        cells = np.rint(motion.positions(sample_u)).astype(int)  # (steps, K, 2)
        occupied = {tuple(c) for c in cells.reshape(-1, 2)}
        free = [(r, c) for r in range(grid) for c in range(grid) if (r, c) not in occupied]
        r, c = free[rng.integers(len(free))]
        clips[i, :, :, r * patch : (r + 1) * patch, c * patch : (c + 1) * patch] += 0.8 * ring
        for k in range(steps):
            frames = slice(k * tubelet, (k + 1) * tubelet)
            for r, c in cells[k]:
                clips[i, :, frames, r * patch : (r + 1) * patch, c * patch : (c + 1) * patch] += (colour * disk)[
                    :, None
                ]
    return torch.from_numpy(clips), torch.from_numpy(labels.astype(np.int64)), drawn
