"""Motion classes shared by the generated clips (ucf101/tiny) and events (dvsgesture/tiny).

A sample is an object moving on a grid of cells, one cell per step; the class is the
motion, never the appearance, so a model must relate *where* and *when* objects are:

    0 right      1 left       (horizontal)
    2 down       3 up         (vertical)
    4 down-right 5 up-left    (diagonal)
    6 orbit-cw   7 orbit-ccw  (rotation on the ring of 8 cells around a centre)

Every class is the time reversal of its partner (0-1, 2-3, 4-5, 6-7): both visit the same
kind of cell paths, only in the opposite order, so the class needs time *and* space, and
an encoding blind to the sign of a time offset (a symmetric distance bias) cannot exceed
one half. Positions are in cell units at normalised times u in [0, 1]; at the ``steps``
sample times u = k / (steps - 1) every object sits exactly on a cell (the clips and the
event flashes show it there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MOTIONS = ("right", "left", "down", "up", "down-right", "up-left", "orbit-cw", "orbit-ccw")


@dataclass(frozen=True)
class Motion:
    label: int
    start: np.ndarray  # (K, 2) object positions (row, col) at u = 0 (K = 1 here)
    velocity: np.ndarray  # (K, 2) cells per unit u (translations)
    centre: np.ndarray | None = None  # (2,) orbit centre
    angle0: float = 0.0  # orbit start angle (radians, 0 = east, clockwise positive on screen)
    turn: float = 0.0  # orbit angle swept over u in [0, 1] (sign = sense)

    def positions(self, u: np.ndarray) -> np.ndarray:
        """(len(u), K, 2) positions (row, col) in cell units."""
        u = np.asarray(u, dtype=np.float64)[:, None, None]
        if self.centre is None:
            return self.start[None] + u * self.velocity[None]
        # Orbits run on the square ring of the 8 cells around the centre (radius 1 in the
        # max norm), so that the sample times land on cells like the translations do.
        angle = self.angle0 + self.turn * u[..., 0]
        ring = np.stack([np.sin(angle), np.cos(angle)], axis=-1)
        ring = ring / np.abs(ring).max(axis=-1, keepdims=True)
        return self.centre[None, None] + ring


# Cells per step (row, col) of the translations; rows grow downwards.
_STEPS = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0), "down-right": (1, 1), "up-left": (-1, -1)}


def sample_motion(label: int, grid: int, steps: int, rng: np.random.Generator) -> Motion:
    """A random instance of motion ``label`` whose sample positions all lie inside ``grid``."""
    span = steps - 1  # steps between the first and the last sample
    name = MOTIONS[label]
    if name.startswith("orbit"):
        if grid < 3:
            raise ValueError(f"{name} needs a grid of at least 3, got {grid}")
        centre = rng.integers(1, grid - 1, size=2).astype(np.float64)
        angle0 = rng.integers(0, 8) * np.pi / 4
        sense = 1.0 if name == "orbit-cw" else -1.0  # rows grow downwards: +angle is clockwise
        return Motion(label, np.zeros((1, 2)), np.zeros((1, 2)), centre, angle0, sense * np.pi / 2 * span)
    step = np.array(_STEPS[name], dtype=np.float64)
    if span >= grid:
        raise ValueError(f"{name}: {steps} steps do not fit a grid of {grid}")
    # Per axis: a moving coordinate starts where the whole path stays inside, a still one anywhere.
    start = [rng.integers(0, grid - span) + (span if d < 0 else 0) if d else rng.integers(0, grid) for d in step]
    return Motion(label, np.array([start], dtype=np.float64), (step * span)[None])
