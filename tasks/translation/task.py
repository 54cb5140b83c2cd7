"""Machine translation (CAPE Section 5.3, Appendix D): ``wmt14-en-de``, ``wmt14-en-fr``.

An encoder-decoder transformer (:mod:`.translation_model`) with the benchmarked encoding
in encoder self-attention, causal decoder self-attention and, as configured,
cross-attention; a joint sentencepiece vocabulary trained on the training split
(:mod:`.translation_tokenizer`); beam search (:mod:`.translation_beam`); BLEU and chrF by
sacrebleu and the per-position loss on stacked test sentences (:mod:`.translation_lit`).

``paper`` profiles read WMT'14 as plain parallel text (:mod:`.translation_io`); the
``tiny`` profile builds an English->German corpus from packaged resources
(:mod:`.translation_corpus`). The metric is test BLEU (higher is better).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import model_validator
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from pe_bench.adapters import EncodingFactory, Geometry, PositionEncoding
from pe_bench.harness.config import ConfigError, RunConfig, Strict
from pe_bench.harness.data import SplitDataModule, cache_root, package_version

from .._shared.data_checks import DataReport, scan_files
from ..base import Task
from .corpus import stack_pairs, tiny_corpus
from .io import SPLITS, check_folder, check_split, read_split
from .model import MT_GLOBAL_SHIFT, MT_LOCAL_SHIFT, MT_SCALE, PositionFrame, Seq2SeqTransformer
from .module import DecodingConfig, TextForm, TranslationModule
from .tokenizer import BOS, EOS, PAD, SubwordTokenizer, train_tokenizer


class TranslationDataConfig(Strict):
    source: Literal["tiny", "files"]
    src_lang: str = "en"
    tgt_lang: str = "de"
    dataset_dir: str = ""  # files: folder under --data-root with {train,valid,test}.{src,tgt}
    # files: "moses" for fairseq's Moses-tokenised preparation (the paper profiles), "raw" for
    # untokenised text; decides how BLEU is computed (module.corpus_scores). The tiny corpus is raw.
    text: TextForm = "raw"
    # tiny: sentence pairs per split
    train_size: int = 0
    valid_size: int = 0
    test_size: int = 0
    vocab_size: int = 32000  # joint sentencepiece vocabulary (CAPE: 32k DE, 40k FR)
    max_length: int = 256  # training pairs with a longer side (in subwords) are skipped
    max_positions: int = 1024  # positions the model covers (abspos' table: "covers 1k tokens")
    source_bos: bool = True  # bos first in the source (CAPE: the decoder's hint of position 0)
    # alpha = #target / #source subword tokens of the training split; a number overrides.
    source_position_scale: float | Literal["auto"] = "auto"
    cross_attention_positions: bool = False  # per-layer encodings also act in cross-attention
    shared_frame_methods: list[str] = ["cape"]  # joint source/target augmentation (App. D)
    beam_size: int = 4
    val_beam_size: int = 4
    length_penalty: float = 1.0
    val_limit: int = 0  # validate on the first N pairs only (0: all); decoding dominates tiny runs
    stack_min_words: int = 300  # stacked test targets hold at least this many words
    stack_limit: int = 0  # at most this many stacked pairs (0: all)

    @model_validator(mode="after")
    def _tiny_corpus_is_raw_text(self) -> TranslationDataConfig:
        if self.source == "tiny" and self.text != "raw":
            raise ValueError("data.text: the tiny corpus is raw text (its sentences are built, never tokenised)")
        return self


@dataclass
class PreparedCorpus:
    tokenizer: SubwordTokenizer
    splits: dict[str, list[tuple[list[int], list[int], str, str]]]  # src ids, tgt ids, src text, tgt text
    stacked: list[tuple[list[int], list[int]]]
    alpha: float
    train_max_target: int


class ParallelDataset(Dataset):
    def __init__(self, items: list[tuple[list[int], list[int], str, str]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[list[int], list[int], str, str]:
        return self.items[i]


def collate(items: list[tuple[list[int], list[int], str, str]]) -> dict[str, Any]:
    """Right-padded batch: src, tgt_in (bos + target), tgt_out (target + eos), texts."""
    src = pad_sequence([torch.tensor(i[0]) for i in items], batch_first=True, padding_value=PAD)
    tgt_in = pad_sequence([torch.tensor([BOS, *i[1]]) for i in items], batch_first=True, padding_value=PAD)
    tgt_out = pad_sequence([torch.tensor([*i[1], EOS]) for i in items], batch_first=True, padding_value=PAD)
    return {
        "src": src,
        "tgt_in": tgt_in,
        "tgt_out": tgt_out,
        "src_text": [i[2] for i in items],
        "ref": [i[3] for i in items],
    }


class TranslationDataModule(SplitDataModule):
    collate_fn = staticmethod(collate)

    def __init__(self, corpus: PreparedCorpus, batch_size: int, num_workers: int, seed: int) -> None:
        super().__init__(batch_size, num_workers, seed)
        self.corpus = corpus
        # The corpus names its validation split "valid" (WMT's file names).
        self.splits = {
            "train": ParallelDataset(corpus.splits["train"]),
            "val": ParallelDataset(corpus.splits["valid"]),
            "test": ParallelDataset(corpus.splits["test"]),
        }


class Translation(Task):
    metric = "bleu"
    metric_label = "BLEU"
    higher_is_better = True
    score_scale = 1.0  # sacrebleu already reports 0-100
    DataConfig = TranslationDataConfig
    data: TranslationDataConfig
    #: the language pair the task names (wmt14-en-fr: ("en", "fr")); None: any (a plug-in's).
    languages: ClassVar[tuple[str, str] | None] = None

    def __init__(self, config: RunConfig, data_root: Path | None = None) -> None:
        super().__init__(config, data_root)
        pair = (self.data.src_lang, self.data.tgt_lang)
        if self.languages is not None and pair != self.languages:
            # until stop 71 the tiny wmt14-en-fr profile set no tgt_lang and trained on German
            raise ConfigError(
                f"{config.task}/{config.profile}: data translates {pair[0]}->{pair[1]}, but {self.name} is "
                f"{self.languages[0]}->{self.languages[1]}: set data.src_lang/tgt_lang in its profile to those"
            )

    def geometry(self) -> Geometry:
        return Geometry(pos_dim=1, grid_shape=(self.data.max_positions,), units="token", num_prefix_tokens=0)

    def folder(self) -> Path:
        d = self.data
        if d.source == "tiny":
            return tiny_corpus(cache_root(), (d.train_size, d.valid_size, d.test_size), d.tgt_lang)
        return Path(self.data_root or ".") / d.dataset_dir

    def data_fingerprint(self) -> dict[str, str | None]:
        """The tokenizer's and the metric's versions, and for the tiny corpus the cache key that
        names its Babel and num2words versions (other versions, other sentences)."""
        fingerprint = {"sentencepiece": package_version("sentencepiece"), "sacrebleu": package_version("sacrebleu")}
        if self.data.source == "tiny":
            fingerprint["corpus"] = self.folder().name
        return fingerprint

    def check_data(self, full: bool = False, workers: int = 1) -> DataReport:
        d, report = self.data, DataReport(self.name)
        if d.source != "files":
            report.notes.append("generated corpus: nothing on disk to check")
            return report
        check_folder(self.folder(), d.src_lang, d.tgt_lang)
        if full:
            items = [(self.folder(), split, d.src_lang, d.tgt_lang) for split in SPLITS]
            report.checked, report.broken = 2 * len(items), scan_files(items, check_split, workers)
        return report

    @cached_property
    def corpus(self) -> PreparedCorpus:
        d = self.data
        folder = self.folder()
        raw = {split: read_split(folder, split, d.src_lang, d.tgt_lang) for split in ("train", "valid", "test")}
        if d.val_limit:
            raw["valid"] = raw["valid"][: d.val_limit]
        train_texts = [t for pair in raw["train"] for t in pair]
        tokenizer = train_tokenizer(train_texts, d.vocab_size, cache_root() / "translation" / "spm")
        prefix = [BOS] if d.source_bos else []

        def encode(pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int], str, str]]:
            src_ids, tgt_ids = tokenizer.encode([p[0] for p in pairs]), tokenizer.encode([p[1] for p in pairs])
            return [(prefix + s + [EOS], t, p[0], p[1]) for s, t, p in zip(src_ids, tgt_ids, pairs, strict=True)]

        splits = {name: encode(pairs) for name, pairs in raw.items()}
        # Training keeps pairs both of whose sides fit; evaluation keeps everything.
        splits["train"] = [i for i in splits["train"] if max(len(i[0]), len(i[1]) + 1) <= d.max_length]
        n_src = sum(len(i[0]) for i in splits["train"])
        n_tgt = sum(len(i[1]) + 1 for i in splits["train"])
        alpha = n_tgt / n_src if d.source_position_scale == "auto" else float(d.source_position_scale)
        stacked_pairs = stack_pairs(raw["test"], d.stack_min_words)
        if d.stack_limit:
            stacked_pairs = stacked_pairs[: d.stack_limit]
        stacked = [(s, t) for s, t, _, _ in encode(stacked_pairs)]
        train_max_target = max(len(i[1]) + 1 for i in splits["train"])
        return PreparedCorpus(tokenizer, splits, stacked, alpha, train_max_target)

    def frame(self, make_encoding: EncodingFactory) -> PositionFrame:
        shared = make_encoding.name in self.data.shared_frame_methods
        if not shared and make_encoding.cls.prepare is not PositionEncoding.prepare:
            # the decoder would prepare the whole target at once: CAPE's mean over its positions
            # lets later target tokens move earlier ones (an audit measured 7e-2 in the logits)
            raise ConfigError(
                f"{self.name}: {make_encoding.name} transforms positions per forward (prepare), which on the "
                "decoder's whole target breaks causality; keep it in data.shared_frame_methods"
            )
        options = make_encoding.options
        local = options.get("max_local_shift")
        return PositionFrame(
            source_scale=self.corpus.alpha,
            cross_attention_positions=self.data.cross_attention_positions,
            shared_frame=shared,
            max_global_shift=float(options.get("max_global_shift", MT_GLOBAL_SHIFT)) if shared else 0.0,
            max_local_shift=MT_LOCAL_SHIFT if local is None else float(local),
            max_scale=float(options.get("max_scale", MT_SCALE)) if shared else 1.0,
        )

    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        corpus = self.corpus
        model = Seq2SeqTransformer(
            make_encoding, self.geometry(), self.config.model, corpus.tokenizer.vocab_size, self.frame(make_encoding)
        )
        model.method_label = make_encoding.name
        return model

    def _stacked_batches(self) -> list[tuple[Tensor, Tensor, Tensor]]:
        items = [(s, t, "", "") for s, t in self.corpus.stacked]
        size = max(1, self.config.optim.batch_size // 8)  # stacked pairs are long
        batches = []
        for start in range(0, len(items), size):
            b = collate(items[start : start + size])
            batches.append((b["src"], b["tgt_in"], b["tgt_out"]))
        return batches

    def lightning_module(self, model: nn.Module) -> TranslationModule:
        d = self.data
        decoding = DecodingConfig(beam_size=d.beam_size, val_beam_size=d.val_beam_size, length_penalty=d.length_penalty)
        return TranslationModule(
            model,  # type: ignore[arg-type]
            self.corpus.tokenizer,
            self.config.optim,
            decoding,
            self._stacked_batches(),
            self.corpus.train_max_target,
            label=getattr(model, "method_label", ""),
            text=d.text,
        )

    def datamodule(self, seed: int) -> TranslationDataModule:
        return TranslationDataModule(self.corpus, self.config.optim.batch_size, self.config.trainer.num_workers, seed)


_TINY = "English->{} sentences built from num2words and Babel (numbers, dates, countries, languages)"


class WMT14EnDe(Translation):
    name = "wmt14-en-de"
    tiny_standin = _TINY.format("German")
    languages = ("en", "de")


class WMT14EnFr(Translation):
    name = "wmt14-en-fr"
    tiny_standin = _TINY.format("French")
    languages = ("en", "fr")
