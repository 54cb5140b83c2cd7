"""SpeechDataModule on the shared SplitDataModule: length-bucketed training batches, evaluation
batches in corpus order, the speech collate function."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from pe_bench.harness.data import SplitDataModule
from pe_bench.tasks.speech.features import encode_text
from pe_bench.tasks.speech.module import SpeechBatch
from pe_bench.tasks.speech.readers import Record
from pe_bench.tasks.speech.task import LengthBucketBatches, SpeechDataConfig, SpeechDataModule

N_MELS = 4


def name(i: int) -> str:
    """Utterance i's text: its digits as letters (0 -> a, 1 -> b, ...), the CTC alphabet has no digits."""
    return "utterance " + "".join(chr(ord("a") + int(d)) for d in str(i))


class FakeUtterances(Dataset):
    """Utterances' interface (``records`` and its item tuple) without audio: utterance i is
    ``i + 1`` frames long and its text names it (:func:`name`)."""

    def __init__(self, count: int, seed: int) -> None:
        durations = torch.rand(count, generator=torch.Generator().manual_seed(seed)).add(0.5).tolist()
        self.records = [Record(Path(f"u{i}.flac"), d, name(i)) for i, d in enumerate(durations)]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        record = self.records[i]
        return torch.zeros(i + 1, N_MELS), encode_text(record.text), record.duration, record.text, 0


def make_module(length_buckets: int, seed: int = 3) -> SpeechDataModule:
    data = SpeechDataConfig(source="tiny", length_buckets=length_buckets)
    module = SpeechDataModule(data, batch_size=4, num_workers=0, seed=seed, data_root=None)
    module.splits = {"train": FakeUtterances(30, 0), "val": FakeUtterances(7, 1), "test": FakeUtterances(9, 2)}
    return module


def indices(batch: SpeechBatch) -> list[int]:
    return [int("".join(str(ord(c) - ord("a")) for c in text.split()[1])) for text in batch.texts]


def test_it_is_a_split_data_module_with_the_speech_collate():
    module = make_module(length_buckets=8)
    assert isinstance(module, SplitDataModule)
    batch = next(iter(module.val_dataloader()))
    assert isinstance(batch, SpeechBatch)
    assert batch.lengths.tolist() == [1, 2, 3, 4] and batch.feats.shape == (4, 4, N_MELS)


def test_bucketed_training_batches_are_the_samplers_epoch_after_epoch():
    module = make_module(length_buckets=2)
    durations = [r.duration for r in module.splits["train"].records]
    expected = LengthBucketBatches(durations, batch_size=4, buckets=2, seed=3)
    loader = module.train_dataloader()
    for epoch in range(2):
        assert [indices(b) for b in loader] == expected.batches(epoch)
    # same seed, same batches in the same order; another seed, another order
    assert [indices(b) for b in make_module(length_buckets=2).train_dataloader()] == expected.batches(0)
    assert [indices(b) for b in make_module(length_buckets=2, seed=4).train_dataloader()] != expected.batches(0)


@pytest.mark.parametrize("split", ["val", "test"])
def test_evaluation_batches_keep_corpus_order(split):
    module = make_module(length_buckets=8)
    loader = getattr(module, f"{split}_dataloader")()
    assert [i for b in loader for i in indices(b)] == list(range(len(module.splits[split])))


def test_without_buckets_training_batches_are_the_shared_seeded_shuffle():
    first = [indices(b) for b in make_module(length_buckets=0).train_dataloader()]
    assert first == [indices(b) for b in make_module(length_buckets=0).train_dataloader()]
    flat = [i for b in first for i in b]
    assert flat != sorted(flat) and len(set(flat)) == len(flat)
    # SplitDataModule's rule: full batches only (30 utterances -> 7 batches of 4, 2 left out)
    assert [len(b) for b in first] == [4] * 7
