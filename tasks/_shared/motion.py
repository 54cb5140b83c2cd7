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

from pe_bench.harness.config import ConfigError

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


#: a motion's path: the cells (row, col) of its sample positions, in time order. It fixes the
#: class (partners visit the same cells in the opposite order), so it is what a test sample's
#: configuration is compared with training by.
MotionPath = tuple[tuple[int, int], ...]


def motion_path(motion: Motion, steps: int) -> MotionPath:
    """The cells of ``motion``'s first object at the ``steps`` sample times."""
    cells = np.rint(motion.positions(np.linspace(0.0, 1.0, steps))[:, 0]).astype(int)
    return tuple((int(r), int(c)) for r, c in cells)


def class_paths(label: int, grid: int, steps: int) -> list[MotionPath]:
    """Every path :func:`sample_motion` can draw for class ``label`` (sorted), by enumerating
    its discrete choices: a translation's start cell, an orbit's centre and start angle."""
    span, name = steps - 1, MOTIONS[label]
    if name.startswith("orbit"):
        sense = 1.0 if name == "orbit-cw" else -1.0
        still = np.zeros((1, 2))
        motions = [
            Motion(label, still, still, np.array([r, c], float), a * np.pi / 4, sense * np.pi / 2 * span)
            for r in range(1, grid - 1) for c in range(1, grid - 1) for a in range(8)
        ]  # fmt: skip
    else:
        step = np.array(_STEPS[name], dtype=np.float64)
        starts = [range(span, grid) if d < 0 else range(grid - span) if d else range(grid) for d in step]
        motions = [Motion(label, np.array([[r, c]], float), (step * span)[None]) for r in starts[0] for c in starts[1]]
    return sorted({motion_path(m, steps) for m in motions})


def split_paths(
    num_classes: int, grid: int, steps: int, held_out: float, seed: int = 4242
) -> tuple[frozenset[MotionPath], frozenset[MotionPath]]:
    """(seen, unseen): every class's paths split so that a ``held_out`` fraction is unseen (at
    least one per class, and at least one left seen). Fixed by ``seed`` alone: every method and
    seed holds out the same paths. Like the image task's ``split_pairs``, for the motion tasks."""
    rng = np.random.default_rng(seed)
    seen: set[MotionPath] = set()
    unseen: set[MotionPath] = set()
    for label in range(num_classes):
        paths = class_paths(label, grid, steps)
        if len(paths) < 2:
            count = f"{len(paths)} path" + ("" if len(paths) == 1 else "s")
            raise ValueError(
                f"class {MOTIONS[label]} has {count} on a {grid}x{grid} grid with {steps} steps, so none "
                "can be held out: use a larger grid (image size / patch size, or sensor width / 8) or fewer steps"
            )
        order = rng.permutation(len(paths))
        cut = min(max(1, round(held_out * len(paths))), len(paths) - 1)
        unseen.update(paths[i] for i in order[:cut])
        seen.update(paths[i] for i in order[cut:])
    return frozenset(seen), frozenset(unseen)


def check_held_out_paths(held_out: float, generated: bool, num_classes: int, grid: int, steps: int, where: str) -> None:
    """A task's ``data.held_out_paths`` as a ConfigError naming the option, before any data is
    made: it needs generated data and at least 2 paths in every class."""
    if not held_out:
        return
    if not generated:
        raise ConfigError(
            f"{where}: data.held_out_paths holds generated motion paths out of training and needs generated "
            "data (the tiny profile's data.source); drop the option for a real dataset"
        )
    try:
        split_paths(num_classes, grid, steps, held_out)
    except ValueError as error:
        raise ConfigError(f"{where}: data.held_out_paths={held_out}: {error}") from None


def sample_motion(
    label: int, grid: int, steps: int, rng: np.random.Generator, paths: frozenset[MotionPath] | None = None
) -> Motion:
    """A random instance of motion ``label`` whose sample positions all lie inside ``grid``;
    with ``paths``, one whose path is among them. Restricted by rejection: without ``paths``
    the draws (and so every stored record's data) are those of the unrestricted generator."""
    for _ in range(_MAX_DRAWS):
        motion = _draw_motion(label, grid, steps, rng)
        if paths is None or motion_path(motion, steps) in paths:
            return motion
    raise ValueError(
        f"no path of class {MOTIONS[label]} on a {grid}x{grid} grid with {steps} steps is among the {len(paths)} "
        f"allowed in {_MAX_DRAWS} draws: were the paths split for another grid or number of steps?"
    )


#: draws before a restricted sample_motion gives up: split_paths leaves every class at least one
#: path, so 100,000 misses in a row (a chance below e^-700 at 1 path of 128) mean that the
#: allowed paths belong to another grid or number of steps.
_MAX_DRAWS = 100_000


def _draw_motion(label: int, grid: int, steps: int, rng: np.random.Generator) -> Motion:
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
