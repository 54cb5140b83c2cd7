"""DvsGesture from its public release: AEDAT 3.1 recordings, label CSVs, trial lists.

Layout under ``--data-root`` (``dataset_dir`` = dvsgesture)::

    dvsgesture/DvsGesture/trials_to_train.txt          user01_fluorescent.aedat ...
    dvsgesture/DvsGesture/trials_to_test.txt
    dvsgesture/DvsGesture/userNN_<lighting>.aedat      AEDAT 3.1 recordings (128 x 128 DVS)
    dvsgesture/DvsGesture/userNN_<lighting>_labels.csv class,startTime_usec,endTime_usec

The split is by user (train users 1-23, test 24-29); validation takes the training users
``val_users`` (21-23, as the public PaPE code does), so no person is in two splits.

AEDAT 3.1: ASCII header lines starting with '#' up to "#!END-HEADER\\r\\n", then packets of
a 28-byte header (type u16, source u16, event size u32, ts offset u32, ts overflow u32,
capacity u32, number u32, valid u32) and ``capacity`` events. Polarity events (type 1,
8 bytes): u32 data (bit 0 valid, bit 1 polarity, bits 2-16 y, bits 17-31 x) and an i32
timestamp in us, extended by ``overflow << 31``.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from pe_bench.harness.data import DatasetMissingError

from .._shared.data_checks import CorruptFileError, MalformedDatasetError, check_class_lists

RELEASE_DIR = "DvsGesture"
HEADER_END = b"#!END-HEADER\r\n"
POLARITY_EVENT = 1
_PACKET = struct.Struct("<HHIIIIII")

Events = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def read_aedat31(path: Path) -> Events:
    """All valid polarity events of an AEDAT 3.1 file: x, y (uint16), t (int64 us), p (bool)."""
    data = Path(path).read_bytes()
    if not data.startswith(b"#!AER-DAT3.1"):
        raise CorruptFileError(path, f"not an AEDAT 3.1 file (first line {data[:20]!r})")
    body = data.find(HEADER_END)
    if body < 0:
        raise CorruptFileError(path, f"AEDAT header has no end marker {HEADER_END!r}")
    index = body + len(HEADER_END)
    words, stamps = [], []
    while index + _PACKET.size <= len(data):
        kind, _, size, _, overflow, capacity, _, _ = _PACKET.unpack_from(data, index)
        index += _PACKET.size
        end = index + size * capacity
        if end > len(data):
            raise CorruptFileError(path, f"truncated packet at byte {index - _PACKET.size}")
        if kind == POLARITY_EVENT and size == 8:
            packet = np.frombuffer(data, dtype="<u4", count=2 * capacity, offset=index).reshape(capacity, 2)
            words.append(packet[:, 0])
            stamps.append((np.int64(overflow) << 31) | packet[:, 1].astype(np.int64))
        index = end
    if not words:
        empty = np.zeros(0, dtype=np.uint16)
        return empty, empty, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    word, t = np.concatenate(words), np.concatenate(stamps)
    valid = (word & 1).astype(bool)
    word, t = word[valid], t[valid]
    x = ((word >> 17) & 0x7FFF).astype(np.uint16)
    y = ((word >> 2) & 0x7FFF).astype(np.uint16)
    p = ((word >> 1) & 1).astype(bool)
    order = np.argsort(t, kind="stable")  # packets may interleave slightly
    return x[order], y[order], t[order], p[order]


def write_aedat31(path: Path, x: np.ndarray, y: np.ndarray, t: np.ndarray, p: np.ndarray, packet: int = 4096) -> None:
    """Write polarity events as AEDAT 3.1 (for fixtures and tests)."""
    header = b"#!AER-DAT3.1\r\n#Format: RAW\r\n#Source 1: DVS128\r\n" + HEADER_END
    chunks = [header]
    t = np.asarray(t, dtype=np.int64)
    # A packet has one overflow value (the bits above 31): split where it changes, then by size.
    cuts = np.flatnonzero(np.diff(t >> 31)) + 1
    bounds = sorted({0, len(t), *cuts.tolist(), *range(0, len(t), packet)})
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        sl = slice(start, stop)
        n = stop - start
        overflow = int(t[start]) >> 31
        word = (x[sl].astype(np.uint32) << 17) | (y[sl].astype(np.uint32) << 2)
        word |= p[sl].astype(np.uint32) << 1 | 1
        stamp = (t[sl] - (overflow << 31)).astype(np.uint32)
        chunks.append(_PACKET.pack(POLARITY_EVENT, 1, 8, 4, overflow, n, n, n))
        chunks.append(np.stack([word, stamp], axis=-1).astype("<u4").tobytes())
    Path(path).write_bytes(b"".join(chunks))


def dvsgesture_root(root: Path) -> Path:
    release = root / RELEASE_DIR
    missing = [
        str(release / f"trials_to_{s}.txt") for s in ("train", "test") if not (release / f"trials_to_{s}.txt").exists()
    ]
    if missing:
        raise DatasetMissingError(
            f"DvsGesture not found: missing {', '.join(missing)}.\n"
            f"Expected layout under {root}:\n"
            f"  {RELEASE_DIR}/trials_to_train.txt, trials_to_test.txt\n"
            f"  {RELEASE_DIR}/userNN_<lighting>.aedat and userNN_<lighting>_labels.csv\n"
            "   (DvsGesture.tar.gz extracted)\n"
            "Source: https://research.ibm.com/interactive/dvsgesture/. pe-bench never downloads it."
        )
    return release


def dvsgesture_samples(
    release: Path, split: str, num_classes: int | None = None
) -> list[tuple[Path, int, int, int, int]]:
    """[(recording, 0-based class, start us, end us, user)] of one official split; a label CSV
    line that is not "class,start,end" with 1 <= class <= ``num_classes`` and start < end is an
    error naming the file and line."""
    samples = []
    for name in (release / f"trials_to_{split}.txt").read_text().split():
        recording = release / name
        labels = release / f"{recording.stem}_labels.csv"
        if not recording.exists() or not labels.exists():
            raise DatasetMissingError(
                f"DvsGesture: {recording} or {labels} is missing (listed in trials_to_{split}.txt)"
            )
        try:
            user = int(recording.stem.split("_")[0].removeprefix("user"))
        except ValueError:
            what = f"DvsGesture: {name} in trials_to_{split}.txt"
            raise MalformedDatasetError(f"{what} is not named userNN_<lighting>.aedat") from None
        for number, line in enumerate(labels.read_text().splitlines()[1:], 2):
            if line.strip():
                label, start, end = _label_line(labels, number, line, num_classes)
                samples.append((recording, label - 1, start, end, user))
    return samples


def _label_line(path: Path, number: int, line: str, num_classes: int | None) -> tuple[int, int, int]:
    try:
        label, start, end = (int(v) for v in line.split(",")[:3])
    except ValueError:
        expected = "expected 'class,startTime_usec,endTime_usec'"
        raise MalformedDatasetError(f"{path}:{number}: {expected}, got {line!r}") from None
    if num_classes is not None and not 1 <= label <= num_classes:
        raise MalformedDatasetError(f"{path}:{number}: class {label} outside 1..{num_classes} (data.num_classes)")
    if end <= start:
        raise MalformedDatasetError(f"{path}:{number}: the gesture ends ({end}) before it starts ({start})")
    return label, start, end


def check_dvsgesture_classes(release: Path, num_classes: int) -> dict[str, list[tuple[Path, int, int, int, int]]]:
    """Both official splits, each with gestures of every class 1..``num_classes``."""
    splits = {split: dvsgesture_samples(release, split, num_classes) for split in ("train", "test")}
    lists = {f"data.num_classes={num_classes}": [str(c) for c in range(1, num_classes + 1)]}
    for split, samples in splits.items():
        lists[f"the label CSVs of {release / f'trials_to_{split}.txt'}"] = [str(s[1] + 1) for s in samples]
    check_class_lists("DvsGesture", lists)
    return splits


def check_recording(item: tuple[Path, list[tuple[int, int]], int, int]) -> None:
    """Full scan: the recording decodes, its events lie on the sensor, every gesture has events."""
    path, windows, width, height = item
    x, y, t, _ = read_aedat31(path)
    if len(x) and (x.max() >= width or y.max() >= height):
        raise CorruptFileError(path, f"events up to x={x.max()}, y={y.max()} on a {width} x {height} sensor")
    for start, end in windows:
        if np.searchsorted(t, end, side="right") == np.searchsorted(t, start, side="left"):
            raise CorruptFileError(path, f"no events in the labelled gesture {start}..{end} us")


def cut(events: Events, start: int, end: int) -> Events:
    """Events with start <= t <= end, time re-based to start."""
    t = events[2]
    lo, hi = np.searchsorted(t, start, side="left"), np.searchsorted(t, end, side="right")
    return events[0][lo:hi], events[1][lo:hi], t[lo:hi] - start, events[3][lo:hi]
