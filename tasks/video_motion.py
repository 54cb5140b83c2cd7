"""Motion classes shared by the generated clips (ucf101/tiny) and events (dvsgesture/tiny).

A sample is an object moving on a grid of cells; the class is the motion, never
the appearance, so a model must relate *where* and *when* objects are:

    0 right-slow  1 right-fast  2 left-slow  3 left-fast   (direction and speed)
    4 orbit-cw    5 orbit-ccw                              (rotation)
    6 up          7 down

Pairs differ only by the direction of time (right/left, cw/ccw, up/down) or by
the spacing of the positions (slow/fast), so an encoding must carry both time and space.
Positions are in cell units at normalised times u in [0, 1]; at the ``steps`` sample
times u = k / (steps - 1) every object sits exactly on a cell (the video clips), in
between it moves continuously (the event camera sees the motion).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MOTIONS = ("right-slow", "right-fast", "left-slow", "left-fast", "orbit-cw", "orbit-ccw", "up", "down")


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


def sample_motion(label: int, grid: int, steps: int, rng: np.random.Generator) -> Motion:
    """A random instance of motion ``label`` whose sample positions all lie inside ``grid``."""
    span = steps - 1  # cell steps between the first and last sample at speed 1
    name = MOTIONS[label]
    if name.startswith(("right", "left")):
        speed = 2 if name.endswith("fast") else 1
        length = speed * span
        if length >= grid:
            raise ValueError(f"{name}: {steps} steps at speed {speed} do not fit a grid of {grid}")
        sign = 1 if name.startswith("right") else -1
        col = rng.integers(0, grid - length) + (length if sign < 0 else 0)
        start = np.array([[rng.integers(0, grid), col]], dtype=np.float64)
        return Motion(label, start, np.array([[0.0, sign * length]]))
    if name.startswith("orbit"):
        centre = rng.integers(1, grid - 1, size=2).astype(np.float64)
        angle0 = rng.integers(0, 8) * np.pi / 4
        sense = 1.0 if name == "orbit-cw" else -1.0  # rows grow downwards: +angle is clockwise
        return Motion(label, np.zeros((1, 2)), np.zeros((1, 2)), centre, angle0, sense * np.pi / 2 * span)
    # up / down: one cell per step along a column.
    sign = -1 if name == "up" else 1
    row = rng.integers(0, grid - span) + (span if sign < 0 else 0)
    start = np.array([[row, rng.integers(0, grid)]], dtype=np.float64)
    return Motion(label, start, np.array([[sign * span, 0.0]]))
