"""The generated event streams of the tiny ``dvsgesture``, rendered by the event-camera
emulator (:func:`pe_bench.tasks._shared.event_emulator.emulate_events`).

Streams: apparent motion of the motion classes of :mod:`.video_motion` on a dark
background: a soft disk flashes (switches on, then off) at the class's sample positions
one after the other, aligned to the cells of the patch grid, and a ring distractor
flashes once elsewhere. A smoothly moving edge would show its direction in the event
timing inside one patch (which a position-free model reads off the token features); a
flash does not, so only where and when patches fire decide the class.
"""

from __future__ import annotations

import numpy as np

from pe_bench.tasks._shared.event_emulator import emulate_events
from pe_bench.tasks._shared.motion import MOTIONS, MotionPath, motion_path, sample_motion

#: an event stream: (x, y, t, polarity) arrays of equal length
Stream = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

#: flashes per emulated stream: the motion's sample positions
EMULATED_STEPS = 3


def _cell_shapes(cell: int, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """A soft disk (the moving object) and a soft ring (the distractor), cell x cell, zero
    outside the cell so that a flash never leaks events into a neighbouring patch."""
    yy, xx = np.mgrid[0:cell, 0:cell] + 0.5 - cell / 2
    dist = np.hypot(yy, xx)
    disk = 1.0 / (1.0 + np.exp((dist - radius) / 0.5))
    ring = np.exp(-(((dist - 0.75 * radius) / 0.6) ** 2))
    return disk, ring


def motion_event_streams(
    count: int,
    num_classes: int = len(MOTIONS),
    grid: int = 6,
    cell: int = 8,
    steps: int = EMULATED_STEPS,
    frames: int = 64,
    duration_us: int = 1_000_000,
    threshold: float = 0.25,
    distractors: int = 1,
    seed: int = 0,
    paths: frozenset[MotionPath] | None = None,
) -> tuple[list[Stream], np.ndarray, list[MotionPath]]:
    """``count`` streams on a (grid * cell)^2 sensor and their (count,) labels, balanced, deterministic.

    Apparent motion: the object flashes at the ``steps`` sample positions of its motion
    class, one after the other (flash k lies in the k-th of ``steps`` equal time slots,
    with a random onset and length), and ``distractors`` rings flash once each at a random
    free cell and time. Every flash is the same disk centred in its cell, so the events of
    one patch look alike in every class: only where and when patches fire tell the motion.
    ``paths``: the flash paths allowed (None: every one), see :func:`split_paths`. Also returns
    each stream's path, the configuration its label depends on.
    """
    rng = np.random.default_rng(seed)
    side = grid * cell
    labels = np.arange(count) % num_classes
    rng.shuffle(labels)
    times = np.linspace(0.0, duration_us, frames)
    slot = frames / steps
    sample_u = np.linspace(0.0, 1.0, steps)
    streams, drawn = [], []
    for label in labels:
        motion = sample_motion(int(label), grid, steps, rng, paths)
        drawn.append(motion_path(motion, steps))
        cells = np.rint(motion.positions(sample_u)[:, 0]).astype(int)  # (steps, 2)
        disk, ring = _cell_shapes(cell, cell * rng.uniform(0.3, 0.45))
        brightness = rng.uniform(0.6, 1.0)
        video = np.full((frames, side, side), 0.1)
        flashes = []
        for k, (r, c) in enumerate(cells):
            # Frame 0 stays dark: the first flash must switch on to be seen.
            on = int(k * slot + 1 + rng.integers(0, max(1, int(slot * 0.3))))
            off = min(frames, on + int(slot * rng.uniform(0.35, 0.6)))
            flashes.append((r, c, on, off, disk))
        occupied = {tuple(rc) for rc in cells.tolist()}
        free = [(r, c) for r in range(grid) for c in range(grid) if (r, c) not in occupied]
        for _ in range(distractors):
            r, c = free.pop(rng.integers(len(free)))
            on = int(rng.integers(1, frames - slot // 2))
            flashes.append((r, c, on, min(frames, on + int(slot * rng.uniform(0.35, 0.6))), ring))
        for r, c, on, off, shape in flashes:
            video[on:off, r * cell : (r + 1) * cell, c * cell : (c + 1) * cell] += brightness * shape
        streams.append(emulate_events(np.clip(video, 0.0, 1.0), times, threshold))
    return streams, labels.astype(np.int64), drawn
