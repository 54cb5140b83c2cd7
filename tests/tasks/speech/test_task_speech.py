"""Speech task: readers on files written in the real layouts, features, CTC decoding, WER,
duration bins, padding invariance, missing-data errors and one very short grid cell."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.cli import main
from pe_bench.harness.config import ModelConfig, load_run_config
from pe_bench.harness.grid import store
from pe_bench.tasks import get_task
from pe_bench.tasks.speech.corpus import CorpusSpec, EspeakMissingError, build_corpus, corpus_built_with
from pe_bench.tasks.speech.features import (
    VOCAB_SIZE,
    LogMel,
    SpecAugment,
    bin_labels,
    decode_tokens,
    duration_bin,
    encode_text,
    greedy_decode,
)
from pe_bench.tasks.speech.model import CTCSpeechModel, FrontEnd, output_lengths, speech_geometry
from pe_bench.tasks.speech.module import wer_table
from pe_bench.tasks.speech.readers import SpeechDatasetError, read_librispeech, read_manifest
from pe_bench.tasks.speech.report import bin_rows
from pe_bench.tasks.speech.task import LengthBucketBatches

RATE = 16_000
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (apt package)")


def tone(seconds: float, freq: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.1 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_manifest_reader_reads_the_kaldi_style_tsv(tmp_path):
    (tmp_path / "wav").mkdir()
    sf.write(tmp_path / "wav" / "a.flac", tone(0.5), RATE)
    sf.write(tmp_path / "wav" / "b.flac", tone(1.2), RATE)
    (tmp_path / "nov92.tsv").write_text("wav/a.flac\t0.5\tHello, World!\nwav/b.flac\t1.2\tit's  A test\n")
    records = read_manifest(tmp_path, "nov92")
    assert [r.text for r in records] == ["hello world", "it's a test"]
    assert [r.duration for r in records] == [0.5, 1.2] and records[0].path == tmp_path / "wav" / "a.flac"
    (tmp_path / "bad.tsv").write_text("wav/a.flac\t0.5\n")
    with pytest.raises(SpeechDatasetError, match=r"bad.tsv:1: expected 3 tab-separated fields"):
        read_manifest(tmp_path, "bad")


def test_librispeech_reader_reads_speaker_chapter_folders(tmp_path):
    chapter = tmp_path / "test-clean" / "1089" / "134686"
    chapter.mkdir(parents=True)
    sf.write(chapter / "1089-134686-0000.flac", tone(0.75), RATE)
    sf.write(chapter / "1089-134686-0001.flac", tone(0.25), RATE)
    (chapter / "1089-134686.trans.txt").write_text("1089-134686-0000 HE HOPED THERE\n1089-134686-0001 STUFF IT\n")
    records = read_librispeech(tmp_path, "test-clean")
    assert [r.text for r in records] == ["he hoped there", "stuff it"]
    assert records[0].duration == pytest.approx(0.75) and records[1].path.name == "1089-134686-0001.flac"


def test_missing_datasets_name_the_path_and_the_layout(tmp_path):
    with pytest.raises(SpeechDatasetError) as err:
        read_manifest(tmp_path / "wsj", "si284", "wsj manifests")
    assert str(tmp_path / "wsj" / "si284.tsv") in str(err.value) and "path<TAB>duration_seconds" in str(err.value)
    with pytest.raises(SpeechDatasetError) as err:
        read_librispeech(tmp_path, "test-other")
    assert str(tmp_path / "test-other") in str(err.value) and "trans.txt" in str(err.value)
    task = get_task("wsj")(load_run_config("wsj", "paper"), tmp_path)
    with pytest.raises(SpeechDatasetError, match=str(tmp_path / "wsj")):
        task.check_data()


def test_missing_espeak_names_the_apt_package(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(EspeakMissingError, match="apt-get install espeak-ng"):
        build_corpus(CorpusSpec(train_size=1, valid_size=1, test_size=1), root=tmp_path)


@needs_espeak
def test_tiny_corpus_is_deterministic_and_cached(tmp_path, monkeypatch):
    spec = CorpusSpec(seed=3, train_size=3, valid_size=1, test_size=2, test_words=(6, 8))
    first = build_corpus(spec, root=tmp_path / "a")
    second = build_corpus(spec, root=tmp_path / "b")
    assert (first / "test.tsv").read_text() == (second / "test.tsv").read_text()
    info = sf.info(str(first / read_manifest(first, "train")[0].path))
    assert info.samplerate == RATE and info.format == "FLAC"
    train, test = read_manifest(first, "train"), read_manifest(first, "test")
    assert max(r.duration for r in train) < max(r.duration for r in test)
    # the corpus records the espeak-ng that spoke it (other versions speak otherwise): the
    # cell's effective.data reads it from there, not from the machine's current espeak-ng
    version = corpus_built_with(first)["espeak-ng"]
    assert re.fullmatch(r"\d+(\.\d+)+\S*", version), version
    monkeypatch.setattr(shutil, "which", lambda name: None)  # a cached corpus needs no espeak-ng
    assert build_corpus(spec, root=tmp_path / "a") == first
    assert corpus_built_with(first) == {"espeak-ng": version}


def test_corpora_built_before_the_espeak_version_was_recorded_say_so(tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps({"seed": 0}))
    assert corpus_built_with(tmp_path) == {"espeak-ng": "unrecorded"}


def test_features_are_80_log_mels_every_10ms_normalised_per_utterance():
    feats = LogMel()(torch.from_numpy(tone(1.0)) + 0.01 * torch.randn(RATE))
    assert feats.shape == (101, 80)
    assert feats.mean(0).abs().max() < 1e-4 and (feats.std(0) - 1).abs().max() < 1e-3
    torch.manual_seed(0)
    masked = SpecAugment(2, 30, 10, 50, 0.1)(feats)
    assert masked.shape == feats.shape and (masked == 0).any()


def test_ctc_greedy_decoding_merges_repeats_and_drops_blanks():
    ids = encode_text("cat a")
    assert decode_tokens(ids) == "cat a" and len(ids) == 5
    c, a, t, sep = encode_text("cat") + encode_text("a b")[1:2]
    path = [c, c, 0, a, t, t, sep, sep, 0, a, a, 0, 0]
    logits = torch.full((1, len(path) + 2, VOCAB_SIZE), -5.0)
    logits[0, torch.arange(len(path)), torch.tensor(path)] = 5.0
    assert greedy_decode(logits, torch.tensor([len(path)])) == ["cat a"]
    # A blank between two equal letters keeps both.
    logits[0, len(path) : len(path) + 2, a] = 5.0
    assert greedy_decode(logits, torch.tensor([len(path) + 2])) == ["cat aa"]


def test_word_error_rate_and_duration_bins():
    from torchmetrics.text import WordErrorRate

    metric = WordErrorRate()
    metric(["the cat sat", "a dog"], ["the cat sat down", "the dog"])  # 1 deletion + 1 substitution
    assert wer_table({"x": metric, "empty": WordErrorRate()}) == {"x": pytest.approx(2 / 6), "empty": None}
    assert bin_labels([10, 15, 20]) == ["<10s", "10-15s", "15-20s", ">=20s"]
    assert [duration_bin(s, [10, 15, 20]) for s in (3.0, 10.0, 14.9, 15.0, 25.0)] == [0, 1, 1, 2, 3]


def test_bin_table_uses_the_matrix_sample_std_over_seeds():
    def cell(seed, wer):
        bins = {"labels": ["<1s", ">=1s", "all"], "wer": {"test": {"<1s": wer, ">=1s": None, "all": wer}}}
        return store.CellRecord("wsj", "rope", seed, "tiny", "ok", score=100 * wer, extra={"duration_bins": bins})

    labels, rows = bin_rows([cell(0, 0.2), cell(1, 0.4), cell(2, 0.3)])
    assert labels == ["<1s", ">=1s", "all"] and rows[0]["seeds"] == 3 and rows[0][">=1s"] is None
    assert rows[0]["all"] == pytest.approx((30.0, 10.0))  # ddof 1, as pandas' std in the matrix
    assert bin_rows([cell(0, 0.2)])[1][0]["all"] == pytest.approx((20.0, 0.0))


@pytest.mark.parametrize("method", ["nopos", "sincos", "abspos", "relpos", "rope", "pape", "cape", "alibi"])
def test_padding_changes_no_logit_of_a_real_frame(method):
    torch.manual_seed(0)
    config = ModelConfig(dim=32, depth=2, num_heads=2)
    unit = "second" if method == "cape" else "frame"
    options = {"coordinates": "raw", "freq_scale": 30.0} if method == "cape" else {}
    model = CTCSpeechModel(
        EncodingFactory(method, options),
        speech_geometry(8),
        config,
        VOCAB_SIZE,
        FrontEnd(n_mels=80),
        unit,
        window_frames=8,
    ).eval()
    short, long = torch.randn(1, 40, 80), torch.randn(1, 70, 80)
    batch = torch.zeros(2, 70, 80)
    batch[0, :40], batch[1] = short[0], long[0]
    alone, n = model(short, torch.tensor([40]))
    padded, lengths = model(batch, torch.tensor([40, 70]))
    assert lengths.tolist() == [n.item(), output_lengths(torch.tensor(70)).item()] and n.item() == 12
    torch.testing.assert_close(padded[0, :12], alone[0], atol=1e-5, rtol=1e-5)


def test_length_buckets_cover_every_utterance_once_in_batches_of_similar_durations():
    durations = torch.rand(203, generator=torch.Generator().manual_seed(0)).mul(3).add(0.5).tolist()
    sampler = LengthBucketBatches(durations, batch_size=16, buckets=4, seed=1)
    epoch0, epoch1 = list(sampler), list(sampler)
    assert len(epoch0) == len(sampler) == 13 and max(len(b) for b in epoch0) == 16
    for batches in (epoch0, epoch1):
        assert sorted(i for b in batches for i in b) == list(range(203))
    assert epoch0 != epoch1 and LengthBucketBatches(durations, 16, 4, seed=1).batches(0) == epoch0

    # Sorting chunks of 4 batches narrows each batch's duration range well below a random batch's.
    def mean_spread(batches):
        return np.mean([max(durations[i] for i in b) - min(durations[i] for i in b) for b in batches])

    shuffled = torch.randperm(203, generator=torch.Generator().manual_seed(2)).tolist()
    assert mean_spread(epoch0) < 0.5 * mean_spread([shuffled[i : i + 16] for i in range(0, 203, 16)])


def test_abspos_wraps_modulo_its_window():
    model = CTCSpeechModel(
        EncodingFactory("abspos"),
        speech_geometry(5),
        ModelConfig(dim=16, depth=1, num_heads=2),
        VOCAB_SIZE,
        FrontEnd(),
        "frame",
        5,
    )
    layout = model.layout(torch.tensor([12]), 12)
    assert layout.grid_shape == (5,) and layout.coords[0, :, 0].tolist() == [i % 5 for i in range(12)]
    cape = CTCSpeechModel(
        EncodingFactory("cape"),
        speech_geometry(5),
        ModelConfig(dim=16, depth=1, num_heads=2),
        VOCAB_SIZE,
        FrontEnd(),
        "second",
        5,
    )
    assert cape.layout(torch.tensor([3]), 3).coords[0, :, 0].tolist() == pytest.approx([0.0, 0.03, 0.06])


TINY = [
    "--set", "data.train_size=24", "--set", "data.valid_size=4", "--set", "data.test_size=6",
    "--set", "data.test_words=[2,8]", "--set", "optim.epochs=1", "--set", "optim.batch_size=8",
    "--set", "model.dim=32", "--set", "model.depth=1", "--set", "data.cache_features=false",
]  # fmt: skip


@needs_espeak
def test_one_cell_end_to_end_writes_the_duration_bin_table(tmp_path, monkeypatch):
    monkeypatch.setenv("PE_BENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "results"
    assert main(["run", "--tasks", "wsj", "--methods", "cape", "--out", str(out), *TINY]) == 0
    record = json.loads((store.cell_dir(out, "wsj", "cape", 0) / "result.json").read_text())
    assert record["status"] == "ok" and record["metric"] == "wer" and record["higher_is_better"] is False
    bins = record["extra"]["duration_bins"]
    assert bins["labels"] == ["<1.5s", "1.5-2.25s", "2.25-3s", ">=3s", "all"]
    assert record["score"] == pytest.approx(100 * bins["wer"]["test"]["all"])
    assert sum(bins["words"]["test"][b] for b in bins["labels"][:-1]) == bins["words"]["test"]["all"]
    table = (out / "bins.md").read_text()
    assert "WER >=3s" in table and re.search(r"\| wsj\s+\| cape\s+\| test\s+\| 1\s+\|", table)
    assert (out / "bins.csv").is_file() and "wsj" in (out / "table.md").read_text()
    # `pe-bench table` rebuilds the bins table from the stored records, not only `run`.
    (out / "bins.md").unlink()
    (out / "bins.csv").unlink()
    assert main(["table", "--out", str(out)]) == 0
    assert (out / "bins.md").read_text() == table and (out / "bins.csv").is_file()


def test_the_bins_table_is_written_by_the_application_from_the_task_frame(tmp_path):
    from pe_bench.harness.reports.tables import write_extra_tables

    bins = {"labels": ["<1s", "all"], "wer": {"test": {"<1s": 0.25, "all": 0.5}}}
    extra = {"duration_bins": bins}
    records = [store.CellRecord("wsj", "rope", seed, "tiny", "ok", score=50.0, extra=extra) for seed in (0, 1)]
    [markdown] = write_extra_tables(tmp_path, records)
    assert "| wsj    | rope     | test       | 2       | 25.0      | 50.0      |" in markdown
    assert (tmp_path / "bins.md").read_text().strip() == markdown
    assert "WER all_mean" in (tmp_path / "bins.csv").read_text()


def test_the_bins_table_holds_the_seeds_the_matrix_averages(tmp_path):
    """A finished cell the matrix leaves out (no config.yaml) is not averaged into the task's
    bins either (until stop 61 the bins came from every stored record: one folder gave other
    bins with and without ``--tasks``); one the matrix averages and marks † (another
    configuration) is averaged and marked here too (from stop 61 to 71 it was dropped, and the
    row read as complete and unmarked, from other seeds than the matrix's)."""
    import yaml

    from pe_bench.harness.reports.tables import write_extra_tables

    for seed, wer, optim in ((0, 0.2, 2), (1, 0.4, 2), (2, 0.9, 2), (3, 0.9, 5)):
        bins = {"labels": ["<1s", "all"], "wer": {"test": {"<1s": wer, "all": wer}}}
        cell = store.cell_dir(tmp_path, "wsj", "rope", seed)
        store.write_record(cell, store.CellRecord("wsj", "rope", seed, "tiny", "ok", score=100 * wer,
                                                  extra={"duration_bins": bins}))  # fmt: skip
        if seed != 2:  # seed 2: no config.yaml, left out of the matrix
            config = {"task": "wsj", "method": "rope", "optim": {"epochs": optim}}
            (cell / "config.yaml").write_text(yaml.safe_dump(config))
    for seed in (4, 5):  # the task's configuration is the one most cells share
        cell = store.cell_dir(tmp_path, "wsj", "cape", seed)
        store.write_record(cell, store.CellRecord("wsj", "cape", seed, "tiny", "ok", score=50.0))
        (cell / "config.yaml").write_text(yaml.safe_dump({"task": "wsj", "method": "cape", "optim": {"epochs": 2}}))
    [markdown] = write_extra_tables(tmp_path)
    assert "| wsj    | rope     | test       | 3/6 †   | 50.0 ± 36.1" in markdown
    assert "wsj/rope/seed3: optim.epochs=5 (others: 2)" in markdown
    assert "Left out, incomplete cell: wsj/rope/seed2 (no config.yaml)." in markdown


@pytest.mark.parametrize("edges", [[], [2.0]])
def test_each_utterance_counts_once_in_every_bin_it_belongs_to(edges, monkeypatch):
    """Without duration edges the one bin is "all" itself: every utterance was counted twice
    there (the WER unchanged, the stored word count doubled)."""
    from pe_bench.harness.config import OptimConfig
    from pe_bench.tasks.speech import module as speech_module
    from pe_bench.tasks.speech.module import CTCModule, SpeechBatch

    ctc = CTCModule(torch.nn.Identity(), OptimConfig(lr=1e-3, epochs=1, batch_size=2), edges, ["test"])
    monkeypatch.setattr(CTCModule, "forward", lambda self, feats, lengths: (feats, lengths))
    monkeypatch.setattr(speech_module, "greedy_decode", lambda logits, lengths: ["a b c", "d e"])
    empty = torch.zeros(2)
    batch = SpeechBatch(empty, empty, empty, empty, [1.0, 3.0], ["a b c", "d x"], [0, 0])
    ctc.on_test_epoch_start()
    ctc.test_step(batch, 0)
    monkeypatch.setattr(ctc, "log", lambda *args, **kwargs: None)
    ctc.on_test_epoch_end()
    bins = ctc.extra_results()["duration_bins"]
    assert bins["labels"].count("all") == 1
    assert bins["words"]["test"]["all"] == 5 and bins["wer"]["test"]["all"] == pytest.approx(1 / 5)
    if edges:
        assert bins["words"]["test"] == {"<2s": 3, ">=2s": 2, "all": 5}
