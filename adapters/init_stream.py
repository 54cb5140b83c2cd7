"""Paired initialisation: an encoding's random initial values from a stream of its own.

By default an encoding draws its random initial values (RoPE-Mixed's frames, PaPE's
projections, the abspos, relpos and CoPE tables) from torch's global generator, as the backbone's weights
are drawn: every weight drawn after them then differs between two encodings at one seed, and a
comparison of the two carries the difference of their backbones' starting points. On the
unseen-paths ucf101 study a layer that computes axial RoPE's logits, its backbone's weights
shifted that way, scored 91.50 against rope's 98.71 over six seeds (README, "RoPE-Mixed's
frames"): a difference of that size is not the encoding's.

Inside :func:`paired_initialisation` (``model.paired_init: true``) each encoding's construction
and each of its ``make_layer`` calls (:func:`encoding_draws`) draws from the global generator
seeded afresh from a stream of the cell's seed, and the global generator is put back as it
was afterwards: at one seed, every encoding's backbone starts from the same weights, whatever
and however much the encoding draws. Randomness during training (CAPE's augmentations) still
comes from the global generator: only the initial weights are paired.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_STREAM: ContextVar[torch.Generator | None] = ContextVar("encoding_init_stream", default=None)


def encoding_stream_seed(seed: int) -> int:
    """The seed of the encodings' stream for a cell's ``seed``: hashed, so that it is not the
    backbone's own Mersenne Twister sequence (``torch.manual_seed(seed)``) read a second time."""
    digest = hashlib.sha256(f"pe-bench encoding initialisation {seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@contextmanager
def paired_initialisation(seed: int) -> Iterator[None]:
    """Within this block, encodings draw their initial values from a stream of ``seed`` alone."""
    token = _STREAM.set(torch.Generator().manual_seed(encoding_stream_seed(seed)))
    try:
        yield
    finally:
        _STREAM.reset(token)


@contextmanager
def encoding_draws() -> Iterator[None]:
    """Around an encoding's construction or ``make_layer``: inside :func:`paired_initialisation`
    the global CPU generator is seeded from the encodings' stream for the block and restored
    after it; outside, nothing changes (the encoding draws from the global stream)."""
    stream = _STREAM.get()
    if stream is None:
        yield
        return
    seed = int(torch.randint(2**62, (1,), generator=stream))
    # fork_rng over the CPU generator only; seeding the default CPU generator (not
    # torch.manual_seed) leaves the CUDA generators, which fork_rng(devices=[]) does not restore.
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        yield
