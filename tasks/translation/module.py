"""Lightning module for translation: label-smoothed cross-entropy, beam-search BLEU/chrF,
and the per-position log loss on stacked long sentences (CAPE Figure 8).

Validation decodes with ``val_beam_size`` (the checkpoint is chosen by validation BLEU, as
the paper does); test decodes with ``beam_size`` (4 for DE, 5 for FR) and also logs chrF,
the BLEU of copying the source (the floor any model must beat), and the mean negative
log-likelihood of the stacked test set inside / beyond the longest training target. The
per-position table and plot are written next to the cell's logs (the trainer's
``default_root_dir``, which the runner sets to the cell directory).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from pe_bench.harness.config import OptimConfig
from pe_bench.harness.module import TaskModule

from .beam import beam_search
from .model import Seq2SeqTransformer, repeat_layout
from .tokenizer import BOS, EOS, PAD, SubwordTokenizer

#: ids that decoding never emits (fairseq masks PAD likewise; BOS only starts a target)
NEVER_EMITTED = [PAD, BOS]


@dataclass(frozen=True)
class DecodingConfig:
    beam_size: int = 4
    val_beam_size: int = 4
    length_penalty: float = 1.0
    # fairseq's generation limit: at most a * source length + b new tokens
    max_len_a: float = 1.2
    max_len_b: int = 10


#: What the corpus files hold: ``raw`` text (the tiny corpus; WMT as released) or ``moses``,
#: the output of Moses' tokenizer.perl with ``-a`` as fairseq's prepare-wmt14en2{de,fr}.sh writes
#: it (the paper profiles' layout): "Euro @-@ Zone", "nicht , sagte", "&apos;", "&quot;" ...
TextForm = Literal["raw", "moses"]

#: tokenizer.perl's escapes (fairseq's preparation leaves them on), undone in reverse order:
#: "&" was escaped first, so "&amp;" is restored last.
MOSES_ESCAPES = (
    ("&#124;", "|"), ("&lt;", "<"), ("&gt;", ">"), ("&apos;", "'"), ("&quot;", '"'), ("&#91;", "["),
    ("&#93;", "]"), ("&amp;", "&"),
)  # fmt: skip


def moses_characters(line: str) -> str:
    """``line`` with the characters tokenizer.perl adds undone: its escapes, and the ``@-@`` of its
    aggressive hyphen splitting (``-a``: "Euro-Zone" -> "Euro @-@ Zone") turned back into "-".
    Everything else the tokenizer does is add or remove spaces."""
    for escaped, character in MOSES_ESCAPES:
        line = line.replace(escaped, character)
    return line.replace("@-@", "-")


def corpus_scores(hypotheses: list[str], references: list[str], text: TextForm = "raw") -> tuple[float, float]:
    """(BLEU, chrF) in 0-100.

    ``raw`` text: sacreBLEU's standard scores, BLEU with its 13a tokenisation and chrF2.

    ``moses`` text: BLEU over the text's own tokens (sacreBLEU's ``tokenize="none"``, the same
    count as Moses' multi-bleu.perl), i.e. the tokenised BLEU that CAPE Table 2 reports
    ("multi-bleu.perl via the standardized tokenization"); each ``@-@`` is one token, which is
    what the usual compound splitting gives. It is not standard sacreBLEU: that needs the
    untokenised references, and tokenizer.perl cannot be inverted exactly (for German and
    French it spaces apostrophes and non-ASCII quotes without recording which side they were
    attached to), so a detokeniser would only guess at them. 13a run over Moses tokens would be
    neither score: it splits each ``@-@`` into three tokens that match for free. chrF ignores
    whitespace, so chrF2 of :func:`moses_characters` is the standard chrF of the untokenised
    text."""
    import sacrebleu

    if text == "moses":
        bleu = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none").score
        hypotheses, references = [moses_characters(h) for h in hypotheses], [moses_characters(r) for r in references]
    else:
        bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    return float(bleu), float(chrf)


def position_nll(model: Seq2SeqTransformer, batches: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Summed NLL and counts per target position over teacher-forced batches (src, tgt_in, tgt_out)."""
    total = torch.zeros(0)
    count = torch.zeros(0)
    for src, tgt_in, tgt_out in batches:
        logits = model(src, tgt_in).float()
        nll = F.cross_entropy(logits.transpose(1, 2), tgt_out, ignore_index=PAD, reduction="none")
        mask = (tgt_out != PAD).float()
        n = nll.shape[1]
        if n > total.numel():
            total = torch.cat([total, torch.zeros(n - total.numel())])
            count = torch.cat([count, torch.zeros(n - count.numel())])
        total[:n] += (nll * mask).sum(0).cpu()
        count[:n] += mask.sum(0).cpu()
    return total, count


def write_position_table(folder: Path, total: Tensor, count: Tensor, train_max: int, label: str) -> None:
    """position_nll.csv (position, mean NLL, sentences) and position_nll.png (Figure 8 style)."""
    keep = count > 0
    positions = torch.arange(total.numel())[keep]
    mean = (total[keep] / count[keep]).tolist()
    with (folder / "position_nll.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["position", "mean_nll", "count"])
        for pos, value, n in zip(positions.tolist(), mean, count[keep].long().tolist(), strict=True):
            writer.writerow([pos, f"{value:.5f}", n])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(positions.tolist(), mean, lw=1.2, label=label)
    ax.axvline(train_max, color="grey", ls="--", lw=1, label=f"longest training target ({train_max})")
    ax.set_xlabel("target position (subword tokens)")
    ax.set_ylabel("mean negative log-likelihood")
    ax.set_title("Stacked test sentences: loss per position")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "position_nll.png", dpi=120)
    plt.close(fig)


class TranslationModule(TaskModule):
    def __init__(
        self,
        model: Seq2SeqTransformer,
        tokenizer: SubwordTokenizer,
        optim: OptimConfig,
        decoding: DecodingConfig,
        stacked: list[tuple[Tensor, Tensor, Tensor]],
        train_max_target: int,
        label: str = "",
        text: TextForm = "raw",
    ) -> None:
        super().__init__(model, optim)
        self.tokenizer = tokenizer
        self.decoding = decoding
        self.text = text  # the corpus' form, which decides how BLEU and chrF are computed
        self.stacked = stacked  # teacher-forced batches of the stacked test set
        self.train_max_target = train_max_target
        self.label = label
        self._outputs: dict[str, list[tuple[str, str, str]]] = {"val": [], "test": []}

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def scores(self, hypotheses: list[str], references: list[str]) -> tuple[float, float]:
        """(BLEU, chrF) as :func:`corpus_scores` computes them for this corpus' text form."""
        return corpus_scores(hypotheses, references, self.text)

    def training_loss(self, batch: dict) -> Tensor:
        logits = self(batch["src"], batch["tgt_in"]).float()
        return F.cross_entropy(
            logits.transpose(1, 2), batch["tgt_out"], ignore_index=PAD, label_smoothing=self.optim.label_smoothing
        )

    def batch_size_of(self, batch: dict) -> int:
        return batch["src"].shape[0]

    @torch.no_grad()
    def translate(self, src: Tensor, beam_size: int) -> list[str]:
        model = self.model
        memory, _, memory_layout = model.encode(src)
        src_len = (src != PAD).sum(1)
        limit = (src_len.float() * self.decoding.max_len_a).long() + self.decoding.max_len_b
        limit = limit.clamp(max=model.max_positions - 1)
        memory_k = memory.repeat_interleave(beam_size, 0)
        layout_k = repeat_layout(memory_layout, beam_size)

        def step(tokens: Tensor) -> Tensor:
            log_probs = model.decode(tokens, memory_k, layout_k)[:, -1].float().log_softmax(-1)
            # As fairseq: PAD and BOS are never emitted (a PAD would read as key padding for the
            # rest of its hypothesis, and decode drops both silently). Masked after the softmax,
            # so every other score keeps its value.
            log_probs[:, NEVER_EMITTED] = float("-inf")
            return log_probs

        ids = beam_search(
            step, src.shape[0], beam_size, BOS, EOS, limit, self.decoding.length_penalty, device=src.device
        )
        return self.tokenizer.decode(ids)

    def _collect(self, split: str, batch: dict, beam_size: int) -> None:
        hyps = self.translate(batch["src"], beam_size)
        self._outputs[split] += list(zip(hyps, batch["ref"], batch["src_text"], strict=True))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._collect("val", batch, self.decoding.val_beam_size)

    def on_validation_epoch_end(self) -> None:
        outputs, self._outputs["val"] = self._outputs["val"], []
        if outputs:
            bleu, _ = self.scores([o[0] for o in outputs], [o[1] for o in outputs])
            self.log("val/bleu", bleu, prog_bar=True)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._collect("test", batch, self.decoding.beam_size)

    def on_test_epoch_end(self) -> None:
        outputs, self._outputs["test"] = self._outputs["test"], []
        hyps, refs, srcs = ([o[i] for o in outputs] for i in range(3))
        bleu, chrf = self.scores(hyps, refs)
        copy_bleu, _ = self.scores(srcs, refs)
        self.log_dict({"test/bleu": bleu, "test/chrf": chrf, "test/copy_bleu": copy_bleu})
        folder = Path(self.trainer.default_root_dir)
        # A few translations next to the scores make failures easy to read.
        (folder / "test_samples.txt").write_text(
            "".join(f"SRC {s}\nREF {r}\nHYP {h}\n\n" for h, r, s in outputs[:20]), encoding="utf-8"
        )
        if not self.stacked:
            return
        device = self.device
        batches = [tuple(t.to(device) for t in b) for b in self.stacked]
        total, count = position_nll(self.model, batches)
        seen = min(self.train_max_target, total.numel())
        inside = total[:seen].sum() / count[:seen].sum().clamp_min(1)
        beyond = total[seen:].sum() / count[seen:].sum().clamp_min(1)
        self.log_dict({"test/nll_seen_positions": float(inside), "test/nll_unseen_positions": float(beyond)})
        write_position_table(folder, total, count, self.train_max_target, self.label)
