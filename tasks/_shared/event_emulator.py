"""An event-camera emulator: rendered intensity frames -> DVS events.

The usual DVS model, as in ESIM/v2e without noise models: every pixel keeps a reference log
intensity; whenever the log intensity has moved by the contrast threshold C from it, the
pixel emits an event of that sign and the reference moves by C. Between two rendered frames
the log intensity is taken as linear in time, so the k-th crossing gets its interpolated
timestamp; the stream is sorted by time.
"""

from __future__ import annotations

import numpy as np


def emulate_events(
    frames: np.ndarray, times_us: np.ndarray, threshold: float = 0.25, eps: float = 1e-3
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(F, H, W) intensities in [0, 1] at ``times_us`` -> events (x, y, t, p) sorted by t."""
    log = np.log(frames.astype(np.float64) + eps)
    reference = log[0].copy()
    xs, ys, ts, ps = [], [], [], []
    for k in range(1, len(frames)):
        before, after = log[k - 1], log[k]
        delta = after - reference
        count = np.floor(np.abs(delta) / threshold).astype(np.int64)
        rows, cols = np.nonzero(count)
        if not len(rows):
            continue
        n = count[rows, cols]
        sign = np.sign(delta[rows, cols])
        # The j-th crossing (j = 1..n) of pixel i: level reference + sign * j * C.
        pixel = np.repeat(np.arange(len(rows)), n)
        j = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n) + 1
        level = reference[rows, cols][pixel] + sign[pixel] * j * threshold
        start, stop = before[rows, cols][pixel], after[rows, cols][pixel]
        frac = np.clip((level - start) / np.where(stop == start, 1.0, stop - start), 0.0, 1.0)
        ts.append(times_us[k - 1] + frac * (times_us[k] - times_us[k - 1]))
        xs.append(cols[pixel])
        ys.append(rows[pixel])
        ps.append(sign[pixel] > 0)
        reference[rows, cols] += sign * n * threshold
    if not ts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, np.zeros(0, dtype=bool)
    t = np.rint(np.concatenate(ts)).astype(np.int64)
    order = np.argsort(t, kind="stable")
    return (np.concatenate(xs)[order], np.concatenate(ys)[order], t[order], np.concatenate(ps)[order])
