"""Speech recognition with a CTC transformer: ``wsj`` and ``tedlium`` (CAPE Section 5.2).

``paper`` profiles read WSJ (si284 / nov93dev / nov92) or TED-LIUM v3 prepared as
manifests (:mod:`.speech_readers`) from ``--data-root`` and also evaluate on LibriSpeech
test-clean/test-other when those folders are present; ``tiny`` profiles use the espeak-ng
corpus of :mod:`.speech_corpus`. The result matrix shows the overall test WER; the WER per
duration bin of every cell is stored in its record and written to ``bins.md``/``bins.csv``
next to the matrix (:mod:`.speech_report`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from pe_bench.adapters import EncodingFactory, Geometry
from pe_bench.harness.config import Strict
from pe_bench.harness.data import SplitDataModule, package_version

from .._shared.data_checks import DataReport, scan_files
from ..base import Task
from .corpus import CorpusSpec, build_corpus, cache_root, corpus_built_with, espeak_binary
from .features import VOCAB_SIZE, LogMel, SpecAugment, encode_text
from .model import CTCSpeechModel, FrontEnd, speech_geometry
from .module import CTCModule, SpeechBatch
from .readers import Record, SpeechDatasetError, check_audio, read_audio, read_librispeech, read_manifest
from .report import bins_table


class SpeechDataConfig(Strict):
    source: Literal["tiny", "manifest"]
    dataset_dir: str = ""  # manifest folder under --data-root
    train_split: str = "train"
    valid_split: str = "valid"
    test_split: str = "test"
    # LibriSpeech folder under --data-root; its sets are evaluated when present.
    librispeech_dir: str = ""
    librispeech_sets: list[str] = ["test-clean", "test-other"]
    # features (CAPE App. C.2)
    sample_rate: int = 16_000
    n_mels: int = 80
    win_ms: float = 25.0
    hop_ms: float = 10.0
    cache_features: bool = False  # keep every utterance's features in memory (small corpora)
    # Training batches of similar durations: shuffle, sort chunks of this many batches by
    # duration, shuffle the batches (less padding; 0 = plain shuffling).
    length_buckets: int = 0
    conv_dropout: float = 0.3
    # SpecAugment (CAPE App. C.2: 2 frequency masks of <= 30 bands, 10 time masks of <= 50 frames, p = 0.1)
    freq_masks: int = 2
    freq_width: int = 30
    time_masks: int = 10
    time_width: int = 50
    time_ratio: float = 0.1
    # evaluation: duration bin edges in seconds (CAPE 5.2: 10, 15, 20)
    bin_edges: list[float] = [10.0, 15.0, 20.0]
    # positions: "second" or "frame" (30 ms front-end frames) per encoding; others use default_unit
    default_unit: Literal["frame", "second"] = "frame"
    position_units: dict[str, Literal["frame", "second"]] = {"cape": "second"}
    # abspos: a table covering this many seconds; beyond it E(t mod N) (CAPE 5.2: 13.8 s)
    abspos_window_s: float = 13.8
    abspos_modulo: bool = True
    # tiny corpus only
    corpus_seed: int = 0
    train_size: int = 1200
    valid_size: int = 150
    test_size: int = 300
    train_words: tuple[int, int] = (2, 5)
    test_words: tuple[int, int] = (2, 14)
    noise: float = 0.003


class Utterances(Dataset):
    """Records -> (features, token ids, duration, text, set index); features on the fly or cached."""

    def __init__(self, records: list[Record], features: LogMel, augment: SpecAugment | None, cache: bool, set_index=0):
        self.records = records
        self.features = features
        self.augment = augment
        self.set_index = set_index
        self.cache: dict[int, torch.Tensor] | None = {} if cache else None

    def __len__(self) -> int:
        return len(self.records)

    def _features(self, i: int) -> torch.Tensor:
        if self.cache is not None and i in self.cache:
            return self.cache[i]
        audio = read_audio(self.records[i].path, self.features.mel.sample_rate)
        feats = self.features(torch.from_numpy(audio.mean(1)))
        if self.cache is not None:
            self.cache[i] = feats
        return feats

    def __getitem__(self, i: int) -> tuple[torch.Tensor, list[int], float, str, int]:
        feats = self._features(i)
        if self.augment is not None:
            feats = self.augment(feats)
        record = self.records[i]
        return feats, encode_text(record.text), record.duration, record.text, self.set_index


def collate(items: list[tuple[torch.Tensor, list[int], float, str, int]]) -> SpeechBatch:
    """Zero-pad features to the longest utterance (after per-utterance normalisation, so
    padding never changes a real frame's features); concatenate targets for ctc_loss."""
    feats = [item[0] for item in items]
    lengths = torch.tensor([f.shape[0] for f in feats])
    padded = torch.zeros(len(feats), int(lengths.max()), feats[0].shape[1])
    for row, f in enumerate(feats):
        padded[row, : f.shape[0]] = f
    targets = [torch.tensor(item[1], dtype=torch.long) for item in items]
    return SpeechBatch(
        feats=padded,
        lengths=lengths,
        targets=torch.cat(targets),
        target_lengths=torch.tensor([len(t) for t in targets]),
        durations=[item[2] for item in items],
        texts=[item[3] for item in items],
        sets=[item[4] for item in items],
    )


class LengthBucketBatches(Sampler[list[int]]):
    """Batches of utterances of similar duration, reshuffled every epoch from ``seed``.

    Each epoch: a seeded permutation, cut into chunks of ``buckets`` batches, each chunk
    sorted by duration and cut into batches, then the batches in a random order. Every
    utterance is in exactly one batch per epoch."""

    def __init__(self, durations: list[float], batch_size: int, buckets: int, seed: int) -> None:
        self.durations = torch.tensor(durations)
        self.batch_size = batch_size
        self.chunk = batch_size * buckets
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return -(-len(self.durations) // self.batch_size)

    def batches(self, epoch: int) -> list[list[int]]:
        rng = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(len(self.durations), generator=rng)
        batches = []
        for start in range(0, len(order), self.chunk):
            chunk = order[start : start + self.chunk]
            chunk = chunk[torch.argsort(self.durations[chunk], stable=True)].tolist()
            batches += [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        return [batches[i] for i in torch.randperm(len(batches), generator=rng).tolist()]

    def __iter__(self):
        self.epoch += 1
        return iter(self.batches(self.epoch - 1))


class SpeechDataModule(SplitDataModule):
    """Train/val/test utterances; training batches by :class:`LengthBucketBatches` when
    ``data.length_buckets`` > 0, otherwise the shuffled batches of every task."""

    collate_fn = staticmethod(collate)

    def __init__(
        self, data: SpeechDataConfig, batch_size: int, num_workers: int, seed: int, data_root: Path | None
    ) -> None:
        super().__init__(batch_size, num_workers, seed)
        self.data = data
        self.data_root = data_root

    def eval_set_names(self) -> list[str]:
        return [self.data.test_split, *self.librispeech_sets()]

    def librispeech_sets(self) -> list[str]:
        if not self.data.librispeech_dir:
            return []
        root = Path(self.data_root or ".") / self.data.librispeech_dir
        return [s for s in self.data.librispeech_sets if (root / s).is_dir()]

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        data = self.data
        folder = corpus_folder(data, self.data_root)
        source = "tiny espeak-ng corpus" if data.source == "tiny" else f"speech manifests ({data.dataset_dir})"
        records = {s: read_manifest(folder, getattr(data, f"{s}_split"), source) for s in ("train", "valid", "test")}
        features = LogMel(data.sample_rate, data.n_mels, data.win_ms, data.hop_ms)
        augment = SpecAugment(data.freq_masks, data.freq_width, data.time_masks, data.time_width, data.time_ratio)
        cache = data.cache_features
        self.splits["train"] = Utterances(records["train"], features, augment, cache)
        self.splits["val"] = Utterances(records["valid"], features, None, cache)
        test_sets = [Utterances(records["test"], features, None, cache)]
        if cache and data.source == "tiny":
            # The generated corpus lives in pe-bench's cache: keep its features there too, so
            # that only the first cell of a grid pays for them.
            for split, dataset in (
                ("train", self.splits["train"]),
                ("valid", self.splits["val"]),
                ("test", test_sets[0]),
            ):
                load_or_store_features(dataset, folder / f"{split}.{feature_key(data)}.pt")
        root = Path(self.data_root or ".") / data.librispeech_dir
        for index, name in enumerate(self.librispeech_sets(), 1):
            test_sets.append(Utterances(read_librispeech(root, name), features, None, cache, set_index=index))
        self.splits["test"] = torch.utils.data.ConcatDataset(test_sets)

    def train_dataloader(self) -> DataLoader:
        if self.data.length_buckets == 0:
            return super().train_dataloader()
        train = self.splits["train"]
        durations = [record.duration for record in train.records]
        return DataLoader(
            train,
            batch_sampler=LengthBucketBatches(durations, self.batch_size, self.data.length_buckets, self.seed),
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )


def feature_key(data: SpeechDataConfig) -> str:
    return f"feats-{data.sample_rate}-{data.n_mels}-{data.win_ms:g}-{data.hop_ms:g}"


def load_or_store_features(dataset: Utterances, path: Path) -> None:
    if path.is_file():
        dataset.cache = dict(enumerate(torch.load(path, weights_only=True)))
        return
    feats = [dataset._features(i) for i in range(len(dataset))]
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(feats, staging)
    staging.replace(path)  # atomic: a concurrent cell reads either nothing or the whole file


def corpus_spec(data: SpeechDataConfig) -> CorpusSpec:
    return CorpusSpec(
        seed=data.corpus_seed,
        train_size=data.train_size,
        valid_size=data.valid_size,
        test_size=data.test_size,
        train_words=tuple(data.train_words),
        test_words=tuple(data.test_words),
        noise=data.noise,
    )


def corpus_folder(data: SpeechDataConfig, data_root: Path | None) -> Path:
    if data.source == "tiny":
        return build_corpus(corpus_spec(data))
    folder = Path(data_root or ".") / data.dataset_dir
    if not folder.is_dir():
        raise SpeechDatasetError(
            f"speech dataset folder {folder} not found (--data-root {data_root}, dataset_dir {data.dataset_dir!r}).\n"
            f"Expected: {data.train_split}.tsv, {data.valid_split}.tsv and {data.test_split}.tsv, each line "
            "'path<TAB>duration_seconds<TAB>transcript', prepared with the Kaldi recipe."
        )
    return folder


class SpeechRecognition(Task):
    label_smoothing_applies = False  # its loss has none
    metric = "wer"
    metric_label = "WER (%)"
    higher_is_better = False
    score_scale = 100.0
    DataConfig = SpeechDataConfig
    data: SpeechDataConfig
    tiny_standin = "espeak-ng sentences (8 voices, 4 speeds, 4 pitches); test up to 2x the longest training utterance"

    def front_end(self) -> FrontEnd:
        return FrontEnd(self.data.n_mels, self.data.hop_ms / 1000, self.data.conv_dropout)

    def window_frames(self) -> int:
        return max(1, round(self.data.abspos_window_s / self.front_end().frame_seconds))

    def unit(self, method: str) -> Literal["frame", "second"]:
        return self.data.position_units.get(method, self.data.default_unit)

    def geometry(self) -> Geometry:
        return speech_geometry(self.window_frames(), self.data.default_unit)

    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        return CTCSpeechModel(
            make_encoding,
            self.geometry(),
            self.config.model,
            VOCAB_SIZE,
            self.front_end(),
            self.unit(make_encoding.name),
            self.window_frames(),
            self.data.abspos_modulo,
        )

    def datamodule(self, seed: int) -> SpeechDataModule:
        return SpeechDataModule(
            self.data, self.config.optim.batch_size, self.config.trainer.num_workers, seed, self.data_root
        )

    def lightning_module(self, model: nn.Module) -> CTCModule:
        names = self.datamodule(0).eval_set_names()  # the set names depend on the data only
        return CTCModule(model, self.config.optim, self.data.bin_edges, names)

    def data_fingerprint(self) -> dict[str, str | None]:
        """torchaudio's version (resampling, filterbank features), and for the tiny corpus its
        cache key and the espeak-ng version that spoke it."""
        fingerprint = {"torchaudio": package_version("torchaudio")}
        if self.data.source == "tiny":
            spec = corpus_spec(self.data)
            fingerprint |= {"corpus": spec.key(), **corpus_built_with(build_corpus(spec))}
        return fingerprint

    def check_data(self, full: bool = False, workers: int = 1) -> DataReport:
        report = DataReport(self.name)
        if self.data.source == "tiny":
            espeak_binary_if_needed(self.data)
            report.notes.append("generated espeak-ng corpus: nothing on disk to check")
            return report
        d, folder = self.data, corpus_folder(self.data, self.data_root)
        records = {split: read_manifest(folder, split, f"{self.name} manifests") for split in (
            d.train_split, d.valid_split, d.test_split)}  # fmt: skip
        if full:  # LibriSpeech's reader opens every FLAC header: only in the full scan
            librispeech = Path(self.data_root or ".") / d.librispeech_dir
            for name in self.datamodule(0).librispeech_sets():
                records[name] = read_librispeech(librispeech, name)
        report.notes.append(", ".join(f"{len(r)} utterances in {split}" for split, r in records.items()))
        if full:
            items = [(record.path, d.sample_rate) for rs in records.values() for record in rs]
            report.checked, report.broken = len(items), scan_files(items, check_audio, workers)
        return report

    @classmethod
    def extra_tables(cls, records: list[Any]) -> dict[str, pd.DataFrame]:
        """``bins``: WER per utterance-duration bin for every speech task's finished cells."""
        table = bins_table(records)
        return {} if table is None else {"bins": table}


def espeak_binary_if_needed(data: SpeechDataConfig) -> None:
    """A cached corpus needs no espeak-ng; building one does (fail before any training)."""
    if not (cache_root() / "speech-tiny" / corpus_spec(data).key() / "test.tsv").is_file():
        espeak_binary()


class WSJ(SpeechRecognition):
    name = "wsj"


class TedLium(SpeechRecognition):
    name = "tedlium"
