"""The generated event streams of the tiny ``gen1``: boxes in apparent motion, emulated.

Each stream shows one or two objects - "cars" (wide boxes) and "pedestrians" (tall boxes)
of several sizes, each with its own random texture - that move by jumps: an object flashes
(switches on, then off) at 2-4 positions along a straight line, one after the other, on a
dark sensor. The label at the prediction time (the end of the stream) is every object's box
at its *last* position, and its class. The event-camera emulator
(:func:`pe_bench.tasks._shared.event_emulator.emulate_events`) renders the events.

Why position matters: all flashes of an object look alike (same box, same texture, random
and independent timings), and every flash has switched off before the prediction time, so
the most recent token at each of its positions is an OFF token of the same kind. Only the
tokens' times tell which position is the current one, and a backbone without position
encoding cannot tell them apart (the most-recent-token map places every token at its patch,
so it still localises the flashes, but cannot choose among them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pe_bench.tasks._shared.event_emulator import emulate_events

CLASSES = ("car", "pedestrian")
Stream = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
Box = tuple[int, int, int, int]  # (x1, y1, x2, y2) in pixels


def _box_size(rng: np.random.Generator, label: int, sides: tuple[int, int]) -> tuple[int, int]:
    """(w, h): a car is wide, a pedestrian tall; the long side in ``sides``."""
    long = int(rng.integers(sides[0], sides[1] + 1))
    short = max(4, round(long * rng.uniform(0.45, 0.65)))
    return (long, short) if label == 0 else (short, long)


def _path(
    rng: np.random.Generator, w: int, h: int, flashes: int, size: int, gap: int = 2
) -> list[tuple[int, int]] | None:
    """Top-left corners of ``flashes`` non-overlapping boxes on a straight line inside the sensor."""
    angle = rng.uniform(0, 2 * np.pi)
    dx, dy = np.cos(angle), np.sin(angle)
    # The shortest step along (dx, dy) that clears the box in x or in y, then a bit more.
    step = min((w + gap) / max(abs(dx), 1e-6), (h + gap) / max(abs(dy), 1e-6)) * rng.uniform(1.0, 1.3)
    offsets = [(round(k * step * dx), round(k * step * dy)) for k in range(flashes)]
    xs, ys = [o[0] for o in offsets], [o[1] for o in offsets]
    x_range = (-min(xs), size - w - max(xs))
    y_range = (-min(ys), size - h - max(ys))
    if x_range[0] > x_range[1] or y_range[0] > y_range[1]:
        return None
    x0, y0 = int(rng.integers(x_range[0], x_range[1] + 1)), int(rng.integers(y_range[0], y_range[1] + 1))
    return [(x0 + ox, y0 + oy) for ox, oy in offsets]


def _overlaps(a: Box, b: Box, gap: int = 2) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


@dataclass(frozen=True)
class FlashingBoxScene:
    """One generated stream with its labels and the draws a split audit compares."""

    events: Stream  # (x, y, t, p)
    boxes: np.ndarray  # (n, 4) float32: each object's box at its last flash, the label
    labels: np.ndarray  # (n,) int64 classes
    trails: list[tuple[Box, ...]]  # each object's flash boxes in time order (boxes: the last ones)

    @property
    def sample(self) -> tuple[Stream, np.ndarray, np.ndarray]:
        """(stream, boxes, classes): what the task reads of the scene."""
        return self.events, self.boxes, self.labels


def flashing_box_scene(
    rng: np.random.Generator,
    size: int = 64,
    objects: tuple[int, int] = (1, 2),
    sides: tuple[int, int] = (8, 16),
    flashes: tuple[int, int] = (2, 4),
    frames: int = 48,
    duration_us: int = 1_000_000,
    threshold: float = 0.25,
) -> FlashingBoxScene:
    """One stream on a size x size sensor: its events, its objects' boxes at the end of the
    stream and classes, and every object's trail of flash boxes."""
    video = np.full((frames, size, size), 0.1)
    times = np.linspace(0.0, duration_us, frames)
    placed: list[Box] = []
    trails: list[tuple[Box, ...]] = []
    labels = []
    wanted = int(rng.integers(objects[0], objects[1] + 1))
    for _ in range(100 * wanted):
        if len(labels) == wanted:
            break
        label = int(rng.integers(len(CLASSES)))
        w, h = _box_size(rng, label, sides)
        count = int(rng.integers(flashes[0], flashes[1] + 1))
        corners = _path(rng, w, h, count, size)
        if corners is None:
            continue
        trail = [(x, y, x + w, y + h) for x, y in corners]
        if any(_overlaps(a, b) for a in trail for b in placed):
            continue
        placed += trail
        # One texture per object: its flashes differ only in place and time.
        texture = rng.uniform(0.6, 1.0) * rng.uniform(0.55, 1.0, (h, w))
        # Flash k lies in the k-th of ``count`` slots of the first 85% of the stream; the last
        # one has switched off well before the prediction time (the end).
        slot = 0.85 * frames / count
        for k, (x, y) in enumerate(corners):
            on = int(k * slot + 1 + rng.integers(0, max(1, int(0.3 * slot))))
            off = min(int(0.9 * frames), on + max(2, int(slot * rng.uniform(0.35, 0.6))))
            region = video[on:off, y : y + h, x : x + w]
            np.maximum(region, texture, out=region)
        trails.append(tuple(trail))
        labels.append(label)
    events = emulate_events(np.clip(video, 0.0, 1.0), times, threshold)
    boxes = np.array([trail[-1] for trail in trails], dtype=np.float32).reshape(-1, 4)
    return FlashingBoxScene(events, boxes, np.array(labels, dtype=np.int64), trails)


def flashing_box_stream(rng: np.random.Generator, **options: object) -> tuple[Stream, np.ndarray, np.ndarray]:
    """:func:`flashing_box_scene`'s stream, (n, 4) boxes (x1, y1, x2, y2) and (n,) classes."""
    return flashing_box_scene(rng, **options).sample  # type: ignore[arg-type]


def flashing_box_scenes(count: int, seed: int, **options: object) -> list[FlashingBoxScene]:
    """``count`` scenes of :func:`flashing_box_scene`, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    return [flashing_box_scene(rng, **options) for _ in range(count)]  # type: ignore[arg-type]


def flashing_box_streams(count: int, seed: int, **options: object) -> list[tuple[Stream, np.ndarray, np.ndarray]]:
    """:func:`flashing_box_scenes` as the task reads them: (stream, boxes, classes) each."""
    return [scene.sample for scene in flashing_box_scenes(count, seed, **options)]
