"""Prophesee GEN1 automotive detection: the release's files, samples, augmentation.

Layout under ``--data-root`` (``dataset_dir`` = gen1)::

    gen1/train/<recording>_td.dat     events of one recording (ATIS sensor, 304 x 240)
    gen1/train/<recording>_bbox.npy   its boxes: (ts | t, x, y, w, h, class_id, ...) rows
    gen1/val/...   gen1/test/...      the same for the release's validation and test splits

``.dat`` (Prophesee's DAT format): ASCII header lines starting with "% " (with "% Width" and
"% Height"), then one byte event type and one byte event size (8), then events of two
little-endian uint32: the timestamp in us and a word with x (bits 0-13), y (bits 14-27) and
the polarity (bit 28). Boxes are in pixels with (x, y) the top-left corner; class 0 is car,
1 pedestrian.

A sample is one labelled timestamp of a recording: its boxes, and the most recent
``window_events`` events up to that time (PaPE: 500K). As in Prophesee's evaluation of GEN1,
boxes with a diagonal under 30 px or a side under 10 px, and timestamps in the first 0.5 s
of a recording, are left out (``min_box_diagonal``, ``min_box_side``, ``skip_us``). The size
rule (:class:`BoxSizeFilter`) also drops the detections before they are scored, as
Prophesee's evaluator does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from pe_bench.harness.data import DatasetMissingError
from pe_bench.tasks._shared.data_checks import CorruptFileError
from pe_bench.tasks._shared.event_augment import event_drop, rotate_by, rotation_matrix

SPLITS = ("train", "val", "test")
SOURCE = "https://www.prophesee.ai/2020/01/24/prophesee-gen1-automotive-detection-dataset/"
EVENT_DTYPE = np.dtype([("t", "<u4"), ("word", "<u4")])

Events = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def write_dat(path: Path, x: np.ndarray, y: np.ndarray, t: np.ndarray, p: np.ndarray, width: int, height: int) -> None:
    """Events (time-sorted) as a Prophesee DAT file (for tests and small exports)."""
    header = f"% Data file containing CD events.\n% Version 2\n% Width {width}\n% Height {height}\n".encode()
    events = np.empty(len(t), dtype=EVENT_DTYPE)
    events["t"] = t
    events["word"] = x.astype(np.uint32) | (y.astype(np.uint32) << 14) | (p.astype(np.uint32) << 28)
    Path(path).write_bytes(header + bytes([0, EVENT_DTYPE.itemsize]) + events.tobytes())


@lru_cache(maxsize=8)
def read_dat(path: Path) -> np.ndarray:
    """The events of a DAT file as a read-only memory map of (t, word) records."""
    with open(path, "rb") as f:
        while True:
            start = f.tell()
            line = f.readline()
            if not line.startswith(b"%"):
                break
        f.seek(start)
        kind_size = f.read(2)
    if len(kind_size) < 2 or kind_size[1] != EVENT_DTYPE.itemsize:
        raise ValueError(f"{path}: not a DAT file of 8-byte events (event size byte {kind_size[1:]!r})")
    offset = start + 2
    if (Path(path).stat().st_size - offset) % EVENT_DTYPE.itemsize:
        raise ValueError(f"{path}: truncated (the event data is not a whole number of 8-byte events)")
    if Path(path).stat().st_size == offset:
        return np.zeros(0, dtype=EVENT_DTYPE)
    return np.memmap(path, dtype=EVENT_DTYPE, mode="r", offset=offset)


def decode(records: np.ndarray) -> Events:
    """(t, word) records -> x, y (uint16), t (int64 us), p (bool)."""
    word = records["word"]
    x = (word & 0x3FFF).astype(np.uint16)
    y = ((word >> 14) & 0x3FFF).astype(np.uint16)
    return x, y, records["t"].astype(np.int64), ((word >> 28) & 1).astype(bool)


def read_boxes(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ``_bbox.npy`` file -> times (n,) us, boxes (n, 4) (x1, y1, x2, y2) and classes (n,)."""
    rows = np.load(path)
    names = rows.dtype.names or ()
    time_field = "ts" if "ts" in names else "t"
    missing = [f for f in (time_field, "x", "y", "w", "h", "class_id") if f not in names]
    if missing:
        raise ValueError(f"{path}: box file lacks the fields {missing} (has {list(names)})")
    x, y = rows["x"].astype(np.float32), rows["y"].astype(np.float32)
    boxes = np.stack([x, y, x + rows["w"], y + rows["h"]], axis=1).astype(np.float32)
    return rows[time_field].astype(np.int64), boxes, rows["class_id"].astype(np.int64)


def gen1_root(root: Path) -> Path:
    problems = [f"{root / split} is missing" for split in SPLITS if not (root / split).is_dir()]
    if not problems:
        problems = [f"{root / s} has no *_td.dat recordings" for s in SPLITS if not any((root / s).glob("*_td.dat"))]
    if problems:
        raise DatasetMissingError(
            f"GEN1 not found: {'; '.join(problems)}.\n"
            f"Expected layout under {root}:\n"
            "  train/<recording>_td.dat  train/<recording>_bbox.npy   (and the same in val/ and test/)\n"
            f"Source: {SOURCE} (the ATIS Automotive Detection Dataset). pe-bench never downloads it."
        )
    return root


def recordings(split_dir: Path) -> list[Path]:
    """The ``_td.dat`` files of one split, in name order."""
    return sorted(split_dir.glob("*_td.dat"))


def boxes_file_of(events_file: Path) -> Path:
    return events_file.with_name(events_file.name.removesuffix("_td.dat") + "_bbox.npy")


def check_recording(events_file: Path) -> None:
    """Full scan (``pe-bench check-data``): the DAT file and its box file can be read; a
    :class:`CorruptFileError` names the file that cannot."""
    boxes_file = boxes_file_of(events_file)
    if not boxes_file.is_file():
        raise CorruptFileError(boxes_file, "is missing: every <recording>_td.dat needs its _bbox.npy")
    try:
        read_dat(events_file)
    except (OSError, ValueError) as err:
        raise CorruptFileError(events_file, str(err).removeprefix(f"{events_file}: ")) from None
    try:
        read_boxes(boxes_file)
    except (OSError, ValueError, EOFError) as err:  # np.load of a truncated file: ValueError or EOFError
        raise CorruptFileError(boxes_file, str(err).removeprefix(f"{boxes_file}: ")) from None


@dataclass(frozen=True)
class BoxSizeFilter:
    """Prophesee's size rule for GEN1 boxes (``filter_boxes`` in the psee_evaluator.py of
    prophesee-automotive-dataset-toolbox): a box is kept when its squared diagonal is at least
    ``min_diagonal``² and both its sides are at least ``min_side`` pixels.

    Prophesee's evaluator (and RVT and the other GEN1 papers after it) applies it to the ground
    truth *and* to the detections before the COCO evaluation. Filtering only the ground truth
    would turn every correct detection of a small, distant object into a false positive."""

    min_diagonal: float
    min_side: float

    def keep(self, boxes: Any) -> Any:
        """Mask of the (n, 4) boxes (x1, y1, x2, y2; a numpy array or a tensor) the rule keeps."""
        w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        return (w * w + h * h >= self.min_diagonal**2) & (w >= self.min_side) & (h >= self.min_side)


@dataclass(frozen=True)
class LabelledTime:
    recording: Path  # the _td.dat file
    time_us: int
    boxes: np.ndarray  # (n, 4) x1, y1, x2, y2
    labels: np.ndarray  # (n,)


def gen1_samples(
    split_dir: Path, width: int, height: int, min_box_diagonal: float, min_box_side: float, skip_us: int
) -> list[LabelledTime]:
    """Every labelled timestamp of every recording of a split, boxes clipped to the sensor and filtered."""
    samples = []
    for events_file in recordings(split_dir):
        boxes_file = boxes_file_of(events_file)
        if not boxes_file.is_file():
            raise DatasetMissingError(f"{boxes_file} is missing: every <recording>_td.dat needs its _bbox.npy")
        times, boxes, labels = read_boxes(boxes_file)
        boxes = np.clip(boxes, 0, [width, height, width, height]).astype(np.float32)
        # strictly after skip_us, as Prophesee's filter_boxes (``ts > skip_ts``): a label at
        # exactly 0.5 s is left out there too
        keep = BoxSizeFilter(min_box_diagonal, min_box_side).keep(boxes) & (times > skip_us)
        times, boxes, labels = times[keep], boxes[keep], labels[keep]
        for time in np.unique(times):
            at = times == time
            samples.append(LabelledTime(events_file, int(time), boxes[at], labels[at]))
    return samples


def events_before(recording: Path, time_us: int, window: int) -> Events:
    """The last ``window`` events up to ``time_us`` (inclusive), times relative to the first of them."""
    records = read_dat(recording)
    end = int(np.searchsorted(records["t"], time_us, side="right"))
    x, y, t, p = decode(np.asarray(records[max(0, end - window) : end]))
    return x, y, t - (t[0] if len(t) else 0), p


def rotate_boxes(boxes: np.ndarray, degrees: float, width: int, height: int) -> np.ndarray:
    """The axis-aligned boxes around the rotated corners (same rotation as ``rotate_by``), clipped."""
    centre = np.array([width / 2, height / 2])
    x1, y1, x2, y2 = boxes.T
    corners = np.stack([np.stack(c, -1) for c in ((x1, y1), (x2, y1), (x1, y2), (x2, y2))], axis=1)  # (n, 4, 2)
    turned = (corners - centre) @ rotation_matrix(degrees).T + centre
    out = np.concatenate([turned.min(1), turned.max(1)], axis=1)
    return np.clip(out, 0, [width, height, width, height]).astype(np.float32)


class Gen1Augmentation:
    """PaPE's GEN1 augmentations: a random rotation (boxes rotate with the events; those left
    under ``min_side`` px are dropped) and one EventDrop operation (or none)."""

    def __init__(self, width: int, height: int, max_degrees: float = 15.0, min_side: float = 2.0) -> None:
        self.width, self.height, self.max_degrees, self.min_side = width, height, max_degrees, min_side

    def __call__(
        self, events: Events, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator
    ) -> tuple[Events, np.ndarray, np.ndarray]:
        w, h = self.width, self.height
        degrees = rng.uniform(-self.max_degrees, self.max_degrees)
        events = rotate_by(events, degrees, w, h)
        boxes = rotate_boxes(boxes, degrees, w, h)
        keep = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]) >= self.min_side
        events = event_drop(events, rng, w, h)
        return events, boxes[keep], labels[keep]
