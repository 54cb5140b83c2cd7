"""Event-stream augmentations applied before tokenization (PaPE Appendix E, DvsGesture).

EventDrop (Gu et al., 2021): drop a random fraction of all events, the events of a random
time window, or those of a random box (one of them, or none).
NDA (Li et al., 2022): geometric augmentations of the events - horizontal flip (with the
class map of mirrored gestures), rolling (translation with wrap-around), rotation and
horizontal shear about the sensor centre; events leaving the sensor are dropped.

All act on arrays (x, y, t, p) and keep the stream sorted by time (they never move t).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Events = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _keep(events: Events, mask: np.ndarray) -> Events:
    return tuple(a[mask] for a in events)  # type: ignore[return-value]


def drop_events(events: Events, rng: np.random.Generator, max_fraction: float = 0.5) -> Events:
    return _keep(events, rng.random(len(events[2])) >= rng.uniform(0.0, max_fraction))


def drop_by_time(events: Events, rng: np.random.Generator, max_fraction: float = 0.3) -> Events:
    t = events[2]
    if not len(t):
        return events
    t0, t1 = float(t[0]), float(t[-1])
    width = rng.uniform(0.0, max_fraction) * (t1 - t0)
    start = rng.uniform(t0, t1 - width) if t1 - width > t0 else t0
    return _keep(events, (t < start) | (t >= start + width))


def drop_by_area(
    events: Events, rng: np.random.Generator, width: int, height: int, max_fraction: float = 0.3
) -> Events:
    w, h = (int(rng.uniform(0.1, max_fraction) * side) + 1 for side in (width, height))
    x0, y0 = rng.integers(0, width - w + 1), rng.integers(0, height - h + 1)
    x, y = events[0], events[1]
    inside = (x >= x0) & (x < x0 + w) & (y >= y0) & (y < y0 + h)
    return _keep(events, ~inside)


def event_drop(events: Events, rng: np.random.Generator, width: int, height: int) -> Events:
    """One EventDrop operation drawn uniformly from drop-nothing, random events, a time
    window and an area (DvsGesture's and GEN1's augmentations draw it the same way)."""
    choice = rng.integers(0, 4)
    if choice == 1:
        return drop_events(events, rng)
    if choice == 2:
        return drop_by_time(events, rng)
    if choice == 3:
        return drop_by_area(events, rng, width, height)
    return events


def _warp(events: Events, matrix: np.ndarray, shift: np.ndarray, width: int, height: int) -> Events:
    """Map pixel centres by ``matrix`` about the sensor centre, then ``shift``; drop what leaves."""
    centre = np.array([width / 2, height / 2])
    xy = np.stack([events[0], events[1]], axis=-1).astype(np.float64) + 0.5 - centre
    xy = xy @ matrix.T + centre + shift - 0.5
    xy = np.rint(xy).astype(np.int64)
    inside = (xy[:, 0] >= 0) & (xy[:, 0] < width) & (xy[:, 1] >= 0) & (xy[:, 1] < height)
    dtype = events[0].dtype
    x, y = xy[inside, 0].astype(dtype), xy[inside, 1].astype(dtype)
    return (x, y, events[2][inside], events[3][inside])


def rotation_matrix(degrees: float) -> np.ndarray:
    """2x2 rotation of pixel coordinates (x right, y down) by ``degrees``."""
    a = np.deg2rad(degrees)
    return np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])


def rotate_by(events: Events, degrees: float, width: int, height: int) -> Events:
    """Rotate the events by ``degrees`` about the sensor centre; drop those leaving the sensor."""
    return _warp(events, rotation_matrix(degrees), np.zeros(2), width, height)


def rotate(events: Events, rng: np.random.Generator, width: int, height: int, max_degrees: float = 15) -> Events:
    return rotate_by(events, rng.uniform(-max_degrees, max_degrees), width, height)


def shear(events: Events, rng: np.random.Generator, width: int, height: int, max_shear: float = 0.3) -> Events:
    return _warp(events, np.array([[1.0, rng.uniform(-max_shear, max_shear)], [0.0, 1.0]]), np.zeros(2), width, height)


def roll(events: Events, rng: np.random.Generator, width: int, height: int, max_fraction: float = 0.2) -> Events:
    dx = rng.integers(-int(max_fraction * width), int(max_fraction * width) + 1)
    dy = rng.integers(-int(max_fraction * height), int(max_fraction * height) + 1)
    x = ((events[0].astype(np.int64) + dx) % width).astype(events[0].dtype)
    y = ((events[1].astype(np.int64) + dy) % height).astype(events[1].dtype)
    return (x, y, events[2], events[3])


def hflip(events: Events, width: int) -> Events:
    x = (width - 1 - events[0].astype(np.int64)).astype(events[0].dtype)
    return (x, events[1], events[2], events[3])


class EventAugmentation:
    """NDA and/or EventDrop, one random op of each per sample (identity included)."""

    def __init__(
        self,
        width: int,
        height: int,
        nda: bool = True,
        event_drop: bool = True,
        flip_labels: Sequence[int] | None = None,
    ) -> None:
        self.width, self.height = width, height
        self.nda, self.event_drop = nda, event_drop
        # Mirroring changes the class of handed gestures; without a map, no flips.
        self.flip_labels = flip_labels

    def __call__(self, events: Events, label: int, rng: np.random.Generator) -> tuple[Events, int]:
        w, h = self.width, self.height
        if self.nda:
            if self.flip_labels is not None and rng.random() < 0.5:
                events, label = hflip(events, w), int(self.flip_labels[label])
            choice = rng.integers(0, 4)
            if choice == 1:
                events = roll(events, rng, w, h)
            elif choice == 2:
                events = rotate(events, rng, w, h)
            elif choice == 3:
                events = shear(events, rng, w, h)
        if self.event_drop:
            events = event_drop(events, rng, w, h)
        return events, label
