"""Lightning module for CTC speech recognition: CTC loss, greedy decoding, WER overall and
per duration bin (CAPE Section 5.2 evaluation), per evaluation set.

The logged ``val/wer`` and ``test/wer`` are fractions (the task's score_scale makes them %).
The test set of the task is the first evaluation set; further sets (LibriSpeech
test-clean/test-other) and every duration bin are returned by :meth:`extra_results`, which
the runner stores in the cell's record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.text import WordErrorRate

from pe_bench.harness.config import OptimConfig
from pe_bench.harness.module import TaskModule

from .features import BLANK, bin_labels, duration_bin, greedy_decode


@dataclass
class SpeechBatch:
    """One padded batch; Lightning moves its tensor fields to the device (a dataclass)."""

    feats: Tensor  # (B, T, n_mels), zero beyond each length
    lengths: Tensor  # (B,) feature frames
    targets: Tensor  # (sum of target lengths,) concatenated token ids
    target_lengths: Tensor  # (B,)
    durations: list[float]  # seconds
    texts: list[str]
    sets: list[int]  # index into the module's evaluation set names


def wer_table(metrics: dict[str, WordErrorRate]) -> dict[str, float | None]:
    """Computed WER of each metric (None where nothing was scored)."""
    return {k: (float(m.compute()) if m.total > 0 else None) for k, m in metrics.items()}


class CTCModule(TaskModule):
    def __init__(self, model: nn.Module, optim: OptimConfig, bin_edges: list[float], eval_sets: list[str]) -> None:
        super().__init__(model, optim)
        self.bin_edges = list(bin_edges)
        self.bins = bin_labels(bin_edges)
        # the bins and the whole set, each once: without edges the one bin is "all" itself, which
        # counted every utterance twice (the WER unchanged, the words doubled)
        self.labels = list(dict.fromkeys([*self.bins, "all"]))
        self.eval_sets = list(eval_sets)
        self.val_wer = WordErrorRate()
        # One accumulator per (evaluation set, bin) and per set overall: "<set>/<bin>", "<set>/all".
        keys = [f"{s}/{b}" for s in self.eval_sets for b in self.labels]
        self.test_wers = nn.ModuleDict({self._key(k): WordErrorRate() for k in keys})
        self._results: dict[str, Any] = {}

    @staticmethod
    def _key(name: str) -> str:
        return name.replace(".", "_").replace("/", "__")  # ModuleDict keys may not hold '.'

    def forward(self, feats: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        return self.model(feats, lengths)

    def training_loss(self, batch: SpeechBatch) -> Tensor:
        logits, lengths = self(batch.feats, batch.lengths)
        log_probs = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # (T, B, V) for ctc_loss
        # zero_infinity: an utterance whose transcript cannot fit its frames gives no gradient
        # instead of an infinite loss (SpecAugment never shortens, but odd real data may).
        return F.ctc_loss(
            log_probs, batch.targets, lengths, batch.target_lengths, blank=BLANK, reduction="mean", zero_infinity=True
        )

    def batch_size_of(self, batch: SpeechBatch) -> int:
        return len(batch.texts)

    def validation_step(self, batch: SpeechBatch, batch_idx: int) -> None:
        logits, lengths = self(batch.feats, batch.lengths)
        self.val_wer(greedy_decode(logits, lengths), batch.texts)
        self.log("val/wer", self.val_wer, prog_bar=True, on_epoch=True, batch_size=len(batch.texts))

    def on_test_epoch_start(self) -> None:
        for metric in self.test_wers.values():
            metric.reset()

    def test_step(self, batch: SpeechBatch, batch_idx: int) -> None:
        logits, lengths = self(batch.feats, batch.lengths)
        hyps = greedy_decode(logits, lengths)
        for hyp, ref, seconds, set_index in zip(hyps, batch.texts, batch.durations, batch.sets, strict=True):
            name = self.eval_sets[set_index]
            bin_name = self.bins[duration_bin(seconds, self.bin_edges)]
            for key in dict.fromkeys((f"{name}/{bin_name}", f"{name}/all")):
                self.test_wers[self._key(key)].update([hyp], [ref])

    def on_test_epoch_end(self) -> None:
        by_key = wer_table({k: self.test_wers[self._key(k)] for k in self._plain_keys()})
        main = by_key[f"{self.eval_sets[0]}/all"]
        self.log("test/wer", main if main is not None else float("nan"))
        self._results = {
            "duration_bins": {
                "edges_seconds": self.bin_edges,
                "labels": self.labels,
                "wer": {s: {b: by_key[f"{s}/{b}"] for b in self.labels} for s in self.eval_sets},
                "words": {
                    s: {b: int(self.test_wers[self._key(f"{s}/{b}")].total) for b in self.labels}
                    for s in self.eval_sets
                },
            }
        }

    def _plain_keys(self) -> list[str]:
        return [f"{s}/{b}" for s in self.eval_sets for b in self.labels]

    def extra_results(self) -> dict[str, Any]:
        """Per-set, per-duration-bin WER fractions of the last test run (stored by the runner)."""
        return self._results
