"""Acoustic features, the CTC alphabet, greedy decoding and duration bins (CAPE App. C.2).

Features: 80 log-mel filterbanks of a 25 ms window every 10 ms, normalised to zero mean and
unit variance per utterance; SpecAugment (frequency and time masks, no time warping) at
training time only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

# CTC blank first, then the word boundary, the apostrophe and the 26 letters (CAPE 5.2).
BLANK = 0
BOUNDARY = "|"
ALPHABET = (BOUNDARY, "'", *"abcdefghijklmnopqrstuvwxyz")
VOCAB_SIZE = len(ALPHABET) + 1
_INDEX = {char: i + 1 for i, char in enumerate(ALPHABET)}


def encode_text(text: str) -> list[int]:
    """Words joined by the boundary token; characters outside the alphabet are errors."""
    try:
        return [_INDEX[c] for c in BOUNDARY.join(text.split())]
    except KeyError as err:
        raise ValueError(f"character {err.args[0]!r} of {text!r} is not in the CTC alphabet") from None


def decode_tokens(tokens: Sequence[int]) -> str:
    return "".join(ALPHABET[t - 1] for t in tokens if t != BLANK).replace(BOUNDARY, " ").strip()


def greedy_decode(logits: Tensor, lengths: Tensor) -> list[str]:
    """Best path: argmax per frame, merge repeats, drop blanks. logits (B, T, V)."""
    best = logits.argmax(-1).cpu()
    texts = []
    for path, length in zip(best, lengths.cpu().tolist(), strict=True):
        path = torch.unique_consecutive(path[:length]).tolist()
        texts.append(" ".join(decode_tokens(path).split()))
    return texts


class LogMel(nn.Module):
    """Waveform (samples,) -> normalised log-mel features (frames, n_mels)."""

    def __init__(self, sample_rate: int = 16_000, n_mels: int = 80, win_ms: float = 25.0, hop_ms: float = 10.0):
        super().__init__()
        import torchaudio.transforms as T

        win = round(sample_rate * win_ms / 1000)
        self.hop = round(sample_rate * hop_ms / 1000)
        self.mel = T.MelSpectrogram(
            sample_rate, n_fft=2 ** math.ceil(math.log2(win)), win_length=win, hop_length=self.hop, n_mels=n_mels
        )

    @torch.no_grad()
    def forward(self, audio: Tensor) -> Tensor:
        feats = torch.log(self.mel(audio.float()) + 1e-6).T
        return (feats - feats.mean(0)) / feats.std(0).clamp_min(1e-5)


class SpecAugment(nn.Module):
    """Frequency and time masks on one utterance (frames, mels), value 0 = the mean after
    normalisation. Time masks are at most ``time_width`` frames and ``time_ratio`` of the
    utterance each (Park et al.'s p, CAPE App. C.2: 2 x 30 bands, 10 x 50 frames, p = 0.1)."""

    def __init__(self, freq_masks: int, freq_width: int, time_masks: int, time_width: int, time_ratio: float):
        super().__init__()
        import torchaudio.transforms as T

        self.freq = T.FrequencyMasking(freq_width) if freq_masks and freq_width else None
        self.freq_masks = freq_masks
        self.time_masks = time_masks
        self.time_width = time_width
        self.time_ratio = time_ratio

    @torch.no_grad()
    def forward(self, feats: Tensor) -> Tensor:
        import torchaudio.transforms as T

        spec = feats.T.unsqueeze(0)  # torchaudio masks (..., freq, time)
        for _ in range(self.freq_masks if self.freq is not None else 0):
            spec = self.freq(spec)
        width = min(self.time_width, int(self.time_ratio * feats.shape[0]))
        if width > 0:
            masking = T.TimeMasking(width)
            for _ in range(self.time_masks):
                spec = masking(spec)
        return spec.squeeze(0).T


def bin_labels(edges: Sequence[float]) -> list[str]:
    """Names of the duration bins cut at ``edges`` seconds: '<10s', '10-15s', ..., '>=20s'."""
    edges = list(edges)
    if not edges:
        return ["all"]
    names = [f"<{edges[0]:g}s"]
    names += [f"{a:g}-{b:g}s" for a, b in zip(edges, edges[1:], strict=False)]
    return [*names, f">={edges[-1]:g}s"]


def duration_bin(seconds: float, edges: Sequence[float]) -> int:
    """Index of the bin of ``seconds`` (left-closed: an utterance of exactly 10 s is in 10-15s)."""
    return sum(seconds >= e for e in edges)
