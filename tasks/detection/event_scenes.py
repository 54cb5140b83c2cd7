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

import numpy as np

from pe_bench.tasks._shared.event_emulator import emulate_events

CLASSES = ("car", "pedestrian")
Stream = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


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


def _overlaps(a: tuple[int, int, int, int], b: tuple[int, int, int, int], gap: int = 2) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def flashing_box_stream(
    rng: np.random.Generator,
    size: int = 64,
    objects: tuple[int, int] = (1, 2),
    sides: tuple[int, int] = (8, 16),
    flashes: tuple[int, int] = (2, 4),
    frames: int = 48,
    duration_us: int = 1_000_000,
    threshold: float = 0.25,
) -> tuple[Stream, np.ndarray, np.ndarray]:
    """One stream (x, y, t, p) on a size x size sensor, the (n, 4) boxes (x1, y1, x2, y2) of its
    objects at the end of the stream, and their (n,) classes."""
    video = np.full((frames, size, size), 0.1)
    times = np.linspace(0.0, duration_us, frames)
    placed: list[tuple[int, int, int, int]] = []
    boxes, labels = [], []
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
        boxes.append(trail[-1])
        labels.append(label)
    events = emulate_events(np.clip(video, 0.0, 1.0), times, threshold)
    return events, np.array(boxes, dtype=np.float32).reshape(-1, 4), np.array(labels, dtype=np.int64)


def flashing_box_streams(count: int, seed: int, **options: object) -> list[tuple[Stream, np.ndarray, np.ndarray]]:
    """``count`` streams of :func:`flashing_box_stream`, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    return [flashing_box_stream(rng, **options) for _ in range(count)]  # type: ignore[arg-type]
