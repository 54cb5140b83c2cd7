"""Spiking Patches (Øhrstrøm et al., 2025): events -> asynchronous tokens, vectorised.

Every spatial patch of ``patch_size`` x ``patch_size`` pixels counts its events; when the
count reaches the threshold sigma the patch spikes: it emits one token made of exactly
those sigma events, stamped with the time of the last one, and resets. After a spike the
patch ignores its events for the refractory period T (an event at ``t - t_spike < T`` is
dropped). This is the count-and-fire tokenizer PaPE uses on DvsGesture (sigma = 256,
T = 100 ms).

Vectorisation. Per patch, the rule is sequential in events but not in tokens: once events
are grouped by patch (a stable sort keeps each group in time order), a token starts at
the first event not in refractory and ends sigma events later, and the next token starts
at the first event at or after ``t_spike + T``, found by a binary search. One loop step
therefore advances *every* patch by one token, and the loop runs as many steps as the
busiest patch emits tokens (tens), never per event.

Features follow the public implementation: per token a (2, buckets, patch, patch) volume
counting its events per polarity, time bucket and pixel, the buckets being log-spaced in
the event's age before the spike (edges 1 ms x 2^k). The model applies log(1 + x) and a
learned linear embedding (the event ViTs of the ``events`` and ``detection`` families).
:func:`pad_tokens` batches the tokens of several streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class EventTokens:
    """Tokens of one event stream, in spike-time order.

    x, y:     (n,) patch column and row of each token.
    t:        (n,) int64 spike time (time of the token's last event, stream units: us).
    features: (n, 2, buckets, patch, patch) event counts per polarity, age bucket, pixel.
    """

    x: np.ndarray
    y: np.ndarray
    t: np.ndarray
    features: np.ndarray

    def __len__(self) -> int:
        return len(self.t)


@dataclass
class EventBatch:
    features: Tensor  # (B, N, 2, buckets, patch, patch) event counts
    coords: Tensor  # (B, N, 3) patch x, patch y, spike time (us, relative to the sample)
    valid: Tensor  # (B, N) False for padding

    def __len__(self) -> int:
        return self.features.shape[0]


def pad_tokens(streams: list[EventTokens]) -> EventBatch:
    """Pad the token sequences of several streams to the longest one (at least one slot)."""
    length = max(1, *(len(tokens) for tokens in streams))
    shape = streams[0].features.shape[1:]
    features = torch.zeros(len(streams), length, *shape)
    coords = torch.zeros(len(streams), length, 3)
    valid = torch.zeros(len(streams), length, dtype=torch.bool)
    for i, tokens in enumerate(streams):
        n = len(tokens)
        features[i, :n] = torch.from_numpy(tokens.features)
        coords[i, :n] = torch.from_numpy(np.stack([tokens.x, tokens.y, tokens.t], axis=-1).astype(np.float32))
        valid[i, :n] = True
    return EventBatch(features, coords, valid)


class SpikingPatches:
    def __init__(
        self,
        width: int,
        height: int,
        patch_size: int,
        threshold: int = 256,
        refractory_us: int = 100_000,
        buckets: int = 10,
        time_base_us: int = 1000,
    ) -> None:
        if threshold < 1:
            raise ValueError(f"spike threshold must be >= 1, got {threshold}")
        self.width, self.height, self.patch_size = width, height, patch_size
        self.threshold = threshold
        self.refractory_us = refractory_us
        self.buckets = buckets
        self.cols = -(-width // patch_size)
        self.rows = -(-height // patch_size)
        # Upper edges of the age buckets: [0, 1 ms), [1, 2 ms), ..., the last one open-ended.
        self.bucket_edges = time_base_us * 2 ** np.arange(buckets - 1, dtype=np.int64)

    @property
    def feature_shape(self) -> tuple[int, int, int, int]:
        return (2, self.buckets, self.patch_size, self.patch_size)

    def spikes(self, x: np.ndarray, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the tokens are: (patch index, first event, order) of every token.

        ``order`` sorts the events by patch (stably, so by time within a patch); token k
        consists of the events ``order[first[k] : first[k] + threshold]``. Tokens come
        sorted by spike time (ties: by patch index).
        """
        patch = (y // self.patch_size).astype(np.int64) * self.cols + x // self.patch_size
        # Patch indices fit 16 bits for every sensor here: numpy's stable sort of uint16 is
        # a radix sort, linear in the events (the whole tokenizer's hot spot).
        patch = patch.astype(np.uint16 if self.rows * self.cols <= 1 << 16 else np.int64)
        order = np.argsort(patch, kind="stable")
        counts = np.bincount(patch, minlength=self.rows * self.cols)
        seg_end = np.cumsum(counts)
        seg_start = seg_end - counts
        sigma = self.threshold
        empty = np.zeros(0, dtype=np.int64)
        if len(t) < sigma:
            return empty, empty, order
        t_sorted = t[order].astype(np.int64)
        t0 = int(t_sorted.min())
        # One sorted key over the whole stream: patch-major, then time. The span leaves room
        # for t_spike + T inside the patch's own key range, so searches never cross patches.
        span = int(t_sorted.max()) - t0 + self.refractory_us + 1
        key = None
        if self.refractory_us > 0:
            key = patch[order].astype(np.int64) * span + (t_sorted - t0)

        active = np.flatnonzero(counts >= sigma)
        start, end = seg_start[active], seg_end[active]
        patches, firsts = [], []
        while len(active):
            last = start + sigma - 1
            ok = last < end
            active, start, end, last = active[ok], start[ok], end[ok], last[ok]
            if not len(active):
                break
            patches.append(active)
            firsts.append(start)
            if self.refractory_us > 0:
                # First event of the same patch at or after t_spike + T (the refractory rule).
                start = np.searchsorted(key, active * span + (t_sorted[last] - t0 + self.refractory_us))
            else:
                start = last + 1
        if not patches:
            return empty, empty, order
        patch_of = np.concatenate(patches).astype(np.int64)
        first = np.concatenate(firsts).astype(np.int64)
        spike_time = t_sorted[first + sigma - 1]
        by_time = np.lexsort((patch_of, spike_time))
        return patch_of[by_time], first[by_time], order

    def __call__(self, x: np.ndarray, y: np.ndarray, t: np.ndarray, p: np.ndarray) -> EventTokens:
        """Tokenize one time-sorted event stream (x, y pixels; t in us; p polarity 0/1)."""
        if len(t) > 1 and np.any(t[1:] < t[:-1]):
            raise ValueError("events must be sorted by time")
        patch, first, order = self.spikes(x, y, t)
        n, sigma, ps = len(patch), self.threshold, self.patch_size
        members = order[first[:, None] + np.arange(sigma)]  # (n, sigma) event indices
        t_spike = t[members[:, -1]].astype(np.int64)
        age = t_spike[:, None] - t[members].astype(np.int64)
        bucket = np.searchsorted(self.bucket_edges, age, side="right")
        # Flat index of (token, polarity, bucket, row in patch, column in patch).
        cell = np.arange(n)[:, None] * 2 + (p[members] > 0)
        cell = (cell * self.buckets + bucket) * ps + y[members] % ps
        cell = cell * ps + x[members] % ps
        volume = np.bincount(cell.ravel(), minlength=n * 2 * self.buckets * ps * ps)
        return EventTokens(
            x=(patch % self.cols).astype(np.int64),
            y=(patch // self.cols).astype(np.int64),
            t=t_spike,
            features=volume.reshape(n, *self.feature_shape).astype(np.float32),
        )


def reference_tokens(
    tokenizer: SpikingPatches, x: np.ndarray, y: np.ndarray, t: np.ndarray, p: np.ndarray
) -> EventTokens:
    """The rule as a plain per-event loop (slow): the tests' reference for the fast path."""
    ps, sigma = tokenizer.patch_size, tokenizer.threshold
    pending: dict[int, list[int]] = {}
    last_spike: dict[int, int] = {}
    tokens: list[tuple[int, int, list[int]]] = []
    for i in range(len(t)):
        patch = int(y[i]) // ps * tokenizer.cols + int(x[i]) // ps
        if patch in last_spike and int(t[i]) - last_spike[patch] < tokenizer.refractory_us:
            continue
        events = pending.setdefault(patch, [])
        events.append(i)
        if len(events) == sigma:
            tokens.append((int(t[i]), patch, events))
            last_spike[patch] = int(t[i])
            pending[patch] = []
    tokens.sort(key=lambda token: (token[0], token[1]))
    features = np.zeros((len(tokens), *tokenizer.feature_shape), dtype=np.float32)
    for k, (t_spike, _, events) in enumerate(tokens):
        for i in events:
            age = t_spike - int(t[i])
            bucket = int(np.sum(tokenizer.bucket_edges <= age))
            features[k, int(p[i] > 0), bucket, int(y[i]) % ps, int(x[i]) % ps] += 1
    patches = np.array([token[1] for token in tokens], dtype=np.int64)
    return EventTokens(
        x=patches % tokenizer.cols,
        y=patches // tokenizer.cols,
        t=np.array([token[0] for token in tokens], dtype=np.int64),
        features=features,
    )
