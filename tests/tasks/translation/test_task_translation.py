"""Translation task: readers, corpus, beam search, masking, positions, BLEU, one tiny cell."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from pe_bench.adapters import EncodingFactory, Geometry
from pe_bench.harness.config import ModelConfig
from pe_bench.tasks.translation.beam import beam_search
from pe_bench.tasks.translation.corpus import build_pairs, build_unseen_pairs, stack_pairs, tiny_corpus
from pe_bench.tasks.translation.io import DatasetMissingError, read_split
from pe_bench.tasks.translation.model import PositionFrame, Seq2SeqTransformer
from pe_bench.tasks.translation.module import corpus_scores
from pe_bench.tasks.translation.tokenizer import BOS, EOS, PAD

ONE_D = ["nopos", "sincos", "abspos", "relpos", "rope", "pape", "alibi", "cape"]


def write_corpus(folder: Path, pairs: list[tuple[str, str]], splits=("train", "valid", "test")) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits:
        (folder / f"{split}.en").write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")


# -- readers and corpus ----------------------------------------------------------------------
def test_reader_reads_aligned_lines_and_drops_empty_pairs(tmp_path: Path) -> None:
    write_corpus(tmp_path / "wmt14_en_de", [("Hello world.", "Hallo Welt."), ("", "leer"), ("Two.", "Zwei.")])
    pairs = read_split(tmp_path / "wmt14_en_de", "valid", "en", "de")
    assert pairs == [("Hello world.", "Hallo Welt."), ("Two.", "Zwei.")]


def test_missing_dataset_names_path_and_layout(tmp_path: Path) -> None:
    write_corpus(tmp_path / "wmt14_en_de", [("a", "b")], splits=("train", "valid"))
    with pytest.raises(DatasetMissingError) as err:
        read_split(tmp_path / "wmt14_en_de", "train", "en", "de")
    message = str(err.value)
    assert str(tmp_path / "wmt14_en_de") in message and "test.en" in message
    assert "train.de" in message and "statmt.org" in message


def test_paper_profile_checks_the_data_root_before_training(tmp_path: Path) -> None:
    from pe_bench.harness.config import load_run_config
    from pe_bench.tasks import get_task

    task = get_task("wmt14-en-fr")(load_run_config("wmt14-en-fr", "paper"), tmp_path)
    with pytest.raises(DatasetMissingError, match="wmt14_en_fr lacks train.en, train.fr"):
        task.check_data()


def test_each_wmt_task_translates_into_its_own_language(tmp_path: Path) -> None:
    """Until stop 71 the tiny wmt14-en-fr profile set no tgt_lang: its "French" column trained
    and tested on en-de's German corpus. A profile whose pair is not the task's is an error."""
    from pe_bench.harness.config import ConfigError, load_run_config
    from pe_bench.tasks import get_task

    for task, lang in (("wmt14-en-de", "de"), ("wmt14-en-fr", "fr")):
        for profile in ("tiny", "paper"):
            assert get_task(task)(load_run_config(task, profile), tmp_path).data.tgt_lang == lang
    with pytest.raises(ConfigError, match="data translates en->de, but wmt14-en-fr is en->fr"):
        get_task("wmt14-en-fr")(load_run_config("wmt14-en-fr", "tiny", {"data": {"tgt_lang": "de"}}), tmp_path)


def test_tiny_french_corpus() -> None:
    pairs = build_pairs(20, seed=1, tgt="fr")
    assert all(fr and fr != en for en, fr in pairs)


def test_misaligned_files_are_reported(tmp_path: Path) -> None:
    write_corpus(tmp_path, [("a", "b")])
    (tmp_path / "train.de").write_text("b\nc\n")
    with pytest.raises(DatasetMissingError, match="has 1 lines but"):
        read_split(tmp_path, "train", "en", "de")


def test_tiny_corpus_is_deterministic_and_reorders() -> None:
    a, b = build_pairs(50, seed=3), build_pairs(50, seed=3)
    assert a == b and a != build_pairs(50, seed=4)
    # German is not a copy of English: most target words do not occur in the source.
    overlap = sum(len(set(e.split()) & set(d.split())) for e, d in a) / sum(len(d.split()) for _, d in a)
    assert overlap < 0.5


def test_stacking_joins_with_commas_and_lowercase() -> None:
    pairs = [("One day.", "Ein Tag."), ("Two days.", "Zwei Tage."), ("Three.", "Drei.")]
    stacked = stack_pairs(pairs, min_target_words=4)
    assert stacked == [("One day, two days.", "Ein Tag, zwei Tage.")]  # the short remainder is dropped


# -- beam search -----------------------------------------------------------------------------
def table_scorer(table: dict[tuple[int, ...], list[float]], vocab: int):
    """Next-token log-probs from a hand-made table keyed by the prefix after bos."""

    def step(tokens: torch.Tensor) -> torch.Tensor:
        rows = []
        for prefix in tokens.tolist():
            probs = table.get(tuple(prefix[1:]), [1.0 if i == EOS else 0.0 for i in range(vocab)])
            rows.append(torch.tensor(probs).clamp_min(1e-9).log())
        return torch.stack(rows)

    return step


def test_beam_finds_the_best_sequence_that_greedy_misses() -> None:
    vocab = 6
    # Greedy takes 4 (0.6) and then is unsure (0.35 max); 5 (0.4) then eos (1.0) is best: 0.4 > 0.6 * 0.35.
    table = {
        (): [0, 0, 0, 0, 0.6, 0.4],
        (4,): [0, 0, 0, 0.3, 0.35, 0.35],
        (5,): [0, 0, 0, 1.0, 0, 0],
    }
    step = table_scorer(table, vocab)
    greedy = beam_search(step, 1, 1, BOS, EOS, 5, length_penalty=0.0)
    beam = beam_search(step, 1, 2, BOS, EOS, 5, length_penalty=0.0)
    assert greedy[0][0] == 4
    assert beam == [[5, EOS]]


def test_beam_one_is_greedy_decoding() -> None:
    torch.manual_seed(0)
    weights = torch.randn(3, 7, 9)  # one scorer per sentence (row i of the batch is sentence i)

    def step(tokens: torch.Tensor) -> torch.Tensor:
        logits = weights[torch.arange(tokens.shape[0]), tokens[:, -1] % 7].clone()
        logits[:, EOS] += 0.4 * tokens.shape[1]  # eos grows likelier, so every sentence ends
        return logits.log_softmax(-1)

    tokens = torch.full((3, 1), BOS)
    for _ in range(40):
        tokens = torch.cat([tokens, step(tokens).argmax(-1, keepdim=True)], dim=1)
    expected = [row[: row.index(EOS) + 1] for row in tokens[:, 1:].tolist()]
    assert beam_search(step, 3, 1, BOS, EOS, 40, length_penalty=1.0) == expected


# -- model: masking and positions --------------------------------------------------------------
def tiny_model(method: str, cross: bool = True, shared: bool = False) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    config = ModelConfig(dim=32, depth=2, num_heads=4, mlp_ratio=2.0)
    options = {"m": 4} if method == "pape" else {}
    frame = PositionFrame(source_scale=1.25, cross_attention_positions=cross, shared_frame=shared, max_global_shift=5.0)
    geometry = Geometry(pos_dim=1, grid_shape=(64,), units="token")
    return Seq2SeqTransformer(EncodingFactory(method, options), geometry, config, 40, frame).eval()


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, 40, (2, 9), generator=gen), torch.randint(4, 40, (2, 7), generator=gen)


def test_decoding_never_emits_pad_or_bos() -> None:
    """A decoder whose best next token is always PAD, then BOS: beam search takes the next
    best instead (fairseq masks PAD so too), for greedy and beam decoding alike."""
    from types import SimpleNamespace

    from pe_bench.harness.config import OptimConfig
    from pe_bench.tasks.translation.module import DecodingConfig, TranslationModule

    model = tiny_model("nopos")
    original = model.decode

    def decode(tokens, memory, layout):
        logits = original(tokens, memory, layout)
        logits[..., PAD] = logits[..., BOS] = 1e4  # far above every other token
        return logits

    model.decode = decode
    emitted = []
    tokenizer = SimpleNamespace(decode=lambda ids: emitted.extend(ids) or ["" for _ in ids])
    module = TranslationModule(model, tokenizer, OptimConfig(lr=1e-3, epochs=1, batch_size=2), DecodingConfig(), [], 8)
    src, _ = batch()
    for beam in (1, 3):
        emitted.clear()
        module.translate(src, beam)
        tokens = {token for ids in emitted for token in ids}
        assert tokens and not tokens & {PAD, BOS}, (beam, tokens)


@pytest.mark.parametrize("method", ONE_D)
def test_decoder_is_causal(method: str) -> None:
    model = tiny_model(method)
    src, tgt = batch()
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, 40, (2, 3))
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ONE_D)
def test_padding_changes_nothing(method: str) -> None:
    model = tiny_model(method)
    src, tgt = batch()
    pad_src = torch.cat([src, torch.full((2, 5), PAD)], dim=1)
    pad_tgt = torch.cat([tgt, torch.full((2, 3), PAD)], dim=1)
    with torch.no_grad():
        a, b = model(src, tgt), model(pad_src, pad_tgt)
    torch.testing.assert_close(a, b[:, : tgt.shape[1]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["rope", "relpos", "alibi", "pape"])
def test_cross_attention_positions_switch(method: str) -> None:
    """On: the cross-attention layer has a position module that sees target-vs-source offsets
    (alpha-scaled source). Off: cross-attention is content-only."""
    on, off = tiny_model(method, cross=True), tiny_model(method, cross=False)
    assert on.decoder_blocks[0].cross_attn.encoding is not None
    assert off.decoder_blocks[0].cross_attn.encoding is None
    src, tgt = batch()
    with torch.no_grad():
        memory, _, memory_layout = on.encode(src)
        assert torch.allclose(memory_layout.coords[0, :, 0], 1.25 * torch.arange(9.0))
        x = torch.randn(2, tgt.shape[1], 32)
        layout = on._layout(tgt, 1.0, None)
        attn = on.decoder_blocks[0].cross_attn
        logits = attn.logits(x, layout, context=memory, key=memory_layout)
        # Moving the source positions changes cross-attention logits only through the encoding.
        moved = memory_layout.with_coords(memory_layout.coords + 3.0)
        assert not torch.allclose(logits, attn.logits(x, layout, context=memory, key=moved))


def test_shared_frame_shifts_source_and_target_together() -> None:
    model = tiny_model("cape", shared=True).train()
    src, tgt = batch()
    torch.manual_seed(1)
    noise = model.frame_noise(2, torch.device("cpu"))
    enc = model._layout(src, model.frame.source_scale, noise).coords[..., 0]
    dec = model._layout(tgt, 1.0, noise).coords[..., 0]
    # Same global shift: first positions agree up to the two local shifts (|eps| <= 0.5).
    assert torch.all((enc[:, 0] - dec[:, 0]).abs() <= 1.0)
    assert (enc[0, 0] - enc[1, 0]).abs() > 1e-3  # but differ across sentence pairs
    model.eval()
    assert model.frame_noise(2, torch.device("cpu")) is None


def test_shared_frame_falls_back_to_appendix_d_not_to_the_image_defaults(tmp_path: Path) -> None:
    """A profile without cape's frame options gets CAPE App. D's translation values (global
    shift 5, no scaling), not 0 (no augmentation: a CAPE row that silently is not CAPE's) and
    not CAPEOptions' image defaults (0.5, 1.4); the options given still win."""
    from types import SimpleNamespace

    from pe_bench.harness.config import load_run_config
    from pe_bench.tasks import get_task

    task = get_task("wmt14-en-de")(load_run_config("wmt14-en-de", "tiny"), tmp_path)
    task.__dict__["corpus"] = SimpleNamespace(alpha=1.25)  # the frame reads only alpha of it
    bare = task.frame(EncodingFactory("cape"))
    assert (bare.max_global_shift, bare.max_local_shift, bare.max_scale) == (5.0, 0.5, 1.0)
    given = task.frame(EncodingFactory("cape", {"max_global_shift": 2.0, "max_scale": 1.2}))
    assert (given.max_global_shift, given.max_scale) == (2.0, 1.2)
    unshared = task.frame(EncodingFactory("sincos"))
    assert not unshared.shared_frame and (unshared.max_global_shift, unshared.max_scale) == (0.0, 1.0)


# -- metrics ---------------------------------------------------------------------------------
def test_bleu_on_known_strings() -> None:
    refs = ["the cat sat on the mat", "a b c d e"]
    assert corpus_scores(refs, refs)[0] == pytest.approx(100.0)
    bleu, chrf = corpus_scores(["the cat sat on the hat", "x y z"], refs)
    assert 0.0 < bleu < 100.0 and 0.0 < chrf < 100.0
    assert corpus_scores(["q r s t u v", "w"], refs)[0] == pytest.approx(0.0)


# -- end to end ------------------------------------------------------------------------------
def test_tiny_cell_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    from pe_bench.harness.cli import main

    monkeypatch.setenv("PE_BENCH_CACHE", str(tmp_path / "cache"))
    # Small models on a shared CPU run many times faster on one thread (no OpenMP spinning).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    out = tmp_path / "results"
    args = [
        "run",
        "--tasks",
        "wmt14-en-de",
        "--methods",
        "cape",
        "--profile",
        "tiny",
        "--seeds",
        "0",
        "--out",
        str(out),
    ]
    overrides = [
        "optim.epochs=1", "data.train_size=300", "data.valid_size=16", "data.test_size=16", "data.vocab_size=200",
        "data.stack_min_words=20", "data.stack_limit=2", "model.dim=32", "model.depth=1", "data.beam_size=2",
    ]  # fmt: skip
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 0
    cell = out / "runs" / "wmt14-en-de" / "cape" / "seed0"
    record = json.loads((cell / "result.json").read_text())
    assert record["status"] == "ok", record.get("reason")
    assert (cell / "position_nll.csv").read_text().startswith("position,mean_nll,count")
    assert (cell / "position_nll.png").stat().st_size > 0
    # the versions the corpus, tokenizer and BLEU came from, where the tables compare them
    data = yaml.safe_load((cell / "config.yaml").read_text())["effective"]["data"]
    assert set(data) == {"corpus", "sentencepiece", "sacrebleu"} and data["corpus"].startswith("tiny-en-de-")


def _record(cell: Path, status: str = "ok", score: float | None = 20.0) -> None:
    (cell / "result.json").write_text(json.dumps({"status": status, "score": score}))


def test_figure_overlays_methods(tmp_path: Path) -> None:
    from pe_bench.tasks.translation.figure import plot, read_curves

    for method, level in (("rope", 1.0), ("cape", 2.0)):
        cell = tmp_path / "runs" / "wmt14-en-de" / method / "seed0"
        cell.mkdir(parents=True)
        rows = "".join(f"{i},{level + 0.01 * i},3\n" for i in range(30))
        (cell / "position_nll.csv").write_text("position,mean_nll,count\n" + rows)
        _record(cell)
    diverged = tmp_path / "runs" / "wmt14-en-de" / "alibi" / "seed0"  # its test wrote the file
    diverged.mkdir(parents=True)
    (diverged / "position_nll.csv").write_text("position,mean_nll,count\n0,9.0,3\n")
    _record(diverged, status="diverged", score=None)
    curves = read_curves(tmp_path, "wmt14-en-de")
    assert sorted(curves) == ["cape", "rope"] and len(curves["rope"][0]) == 30
    assert plot(tmp_path, "wmt14-en-de", train_max=10).stat().st_size > 0
    with pytest.raises(FileNotFoundError, match="wmt14-en-fr/\\*/seed\\*/position_nll.csv: run the task"):
        read_curves(tmp_path, "wmt14-en-fr")


def test_pooled_nll_weighs_each_position_by_the_sentences_that_reach_it(tmp_path: Path) -> None:
    from pe_bench.tasks.translation.figure import parse_ranges, pooled_nll

    for seed, rows in ((0, "0,1.0,4\n1,2.0,4\n2,6.0,1\n"), (1, "0,3.0,4\n1,2.0,2\n")):
        cell = tmp_path / "runs" / "wmt14-en-de" / "rope" / f"seed{seed}"
        cell.mkdir(parents=True)
        (cell / "position_nll.csv").write_text("position,mean_nll,count\n" + rows)
        _record(cell)
    pooled = pooled_nll(tmp_path, "wmt14-en-de", parse_ranges("0-0,1-"))
    assert pooled.loc["rope", "0-0"] == pytest.approx((1.0 * 4 + 3.0 * 4) / 8)
    assert pooled.loc["rope", "1-"] == pytest.approx((2.0 * 4 + 6.0 + 2.0 * 2) / 7)  # not the mean of the means
    with pytest.raises(ValueError, match="FIRST-LAST"):
        parse_ranges("0-11,72")


def test_data_fingerprint_changes_with_the_corpus_resources(tmp_path: Path, monkeypatch) -> None:
    """Other Babel tables write other tiny sentences: the cell's ``effective.data`` names the
    corpus by a key that holds Babel's and num2words' versions, beside the tokenizer's and
    the metric's versions, so the tables can mark a column mixing two corpora."""
    import babel

    from pe_bench.harness.config import load_run_config, parse_overrides
    from pe_bench.tasks.base import get_task

    monkeypatch.setenv("PE_BENCH_CACHE", str(tmp_path))
    sizes = parse_overrides(["data.train_size=20", "data.valid_size=5", "data.test_size=5"])
    task = get_task("wmt14-en-de")(load_run_config("wmt14-en-de", "tiny", sizes))
    fingerprint = task.data_fingerprint()
    assert set(fingerprint) == {"corpus", "sentencepiece", "sacrebleu"}
    assert fingerprint["corpus"].startswith("tiny-en-de-") and fingerprint["sacrebleu"][0].isdigit()
    monkeypatch.setattr(babel, "__version__", "0.0-other")
    assert task.data_fingerprint()["corpus"] != fingerprint["corpus"]


#: digests of the tiny en-de profile's splits (train 6000 pairs from seed 11, valid 100 and
#: test 200 unseen pairs from seeds 12 and 13; "en<TAB>de" lines) as the README's wmt14 records
#: were trained on them (corpus v 2, stop 65): Babel 2.18.0 and num2words 0.5.14. Babel 2.19.0
#: changes 1,892 of the 6,000 German training sentences (CLDR country names, e.g. "Cabo Verde"
#: for "Curaçao" at one draw).
RECORDED_CORPUS = {
    "train": "7a9e93309fa03d3b7c99f7f8f746a45024b48561",
    "valid": "a12e68cb44eded1133f7b84dc09c45c0315c1f3d",
    "test": "10c8ba77764c38d8eccb43daba8fa79750581312",
}


def _split_pairs(folder: Path, split: str, tgt: str = "de") -> list[tuple[str, str]]:
    sources = (folder / f"{split}.en").read_text(encoding="utf-8").splitlines()
    targets = (folder / f"{split}.{tgt}").read_text(encoding="utf-8").splitlines()
    assert len(sources) == len(targets)
    return list(zip(sources, targets, strict=True))


def test_tiny_corpus_is_the_one_the_records_were_trained_on(tmp_path: Path) -> None:
    import hashlib

    import babel

    from pe_bench.harness.data import package_version

    installed = f"Babel {babel.__version__}, num2words {package_version('num2words')}"
    folder = tiny_corpus(tmp_path, (6000, 100, 200))
    for split, digest in RECORDED_CORPUS.items():
        text = "".join(f"{en}\t{de}\n" for en, de in _split_pairs(folder, split))
        assert hashlib.sha1(text.encode()).hexdigest() == digest, (
            f"the tiny {split} split differs from the one the README's wmt14 records were trained "
            f"on ({installed} installed; pyproject.toml pins the versions that build it)"
        )


@pytest.mark.parametrize("tgt", ["de", "fr"])
def test_tiny_evaluation_splits_hold_no_sentence_of_an_earlier_split(tmp_path: Path, tgt: str) -> None:
    """Stop 64: independent draws put 51 of the 200 en-de test pairs (and 25 of 100 validation
    pairs) verbatim in training, so test BLEU partly measured recall. Every frame must still be
    tested: the verb-final frame had one sentence per language, all of them in training."""
    folder = tiny_corpus(tmp_path, (6000, 100, 200), tgt)
    train, valid, test = (_split_pairs(folder, split, tgt) for split in ("train", "valid", "test"))
    seen = {sentence for pair in train for sentence in pair}
    assert not seen & {sentence for pair in valid for sentence in pair}
    assert not (seen | {sentence for pair in valid for sentence in pair}) & {s for pair in test for s in pair}
    assert len({src for src, _ in test}) == len(test) and len({src for src, _ in valid}) == len(valid)
    assert len(build_pairs(200, 13, tgt)) == 200 and len(test) == 200 and len(valid) == 100
    frames = ("fly to", "speak", "price is", "meeting", "people live", "birds", "paid")
    for split in (valid, test):
        counts = [sum(frame in src for src, _ in split) for frame in frames]
        assert min(counts) > 0, dict(zip(frames, counts, strict=True))
        assert sum(counts) == len(split)  # every pair is one of the frames


def test_tiny_corpus_names_the_sizes_when_the_unseen_sentences_run_out() -> None:
    seen = {sentence for pair in build_pairs(10, 12) for sentence in pair}  # the very draws of seed 12
    with pytest.raises(ValueError, match=r"gave 0 of 10 evaluation pairs unseen .* data\.test_size"):
        build_unseen_pairs(10, 12, seen, "de", draws_per_pair=1)


def test_tokenizer_vocabulary_does_not_depend_on_the_machine(tmp_path: Path, monkeypatch) -> None:
    """sentencepiece's vocabulary depends on its thread count (checked first, so that this
    test can fail); pe-bench's trainer uses a fixed count whatever the CPU count."""
    import os

    from pe_bench.tasks.translation import tokenizer

    texts = [t for pair in build_pairs(6000, seed=11) for t in pair]

    def pieces(cache: str) -> list[tuple[str, float]]:
        sp = tokenizer.train_tokenizer(texts, 1000, tmp_path / cache).sp
        return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]

    fixed = tokenizer.TRAINER_THREADS
    by_threads = []
    for threads in (1, 4):
        monkeypatch.setattr(tokenizer, "TRAINER_THREADS", threads)
        by_threads.append(pieces(f"threads{threads}"))
    assert by_threads[0] != by_threads[1], "sentencepiece no longer depends on its thread count"

    monkeypatch.setattr(tokenizer, "TRAINER_THREADS", fixed)
    trained = []
    for cpus in (1, 16):
        monkeypatch.setattr(os, "cpu_count", lambda cpus=cpus: cpus)
        trained.append(pieces(f"cpus{cpus}"))
    assert trained[0] == trained[1]


def test_the_tokenizer_returns_the_references_characters(tmp_path: Path, monkeypatch) -> None:
    """BLEU compares decoded hypotheses with raw reference lines, so a decoded sentence must be
    the sentence: sentencepiece's default nmt_nfkc normalisation made '…' '...' and 'm²' 'm2'
    (a perfect translation scored 39.1 BLEU). The tiny corpora are NFKC-invariant, so their
    vocabulary is the one nmt_nfkc trained (the records' tokenizer)."""
    from pe_bench.tasks.translation import tokenizer

    odd = ["das haus hat 80 m² , sagte er …", "ein ½ Liter ﬁndet sich", "Straße Nr. ① in Köln"]
    texts = [t for pair in build_pairs(2000, seed=11) for t in pair] + odd * 20
    sp = tokenizer.train_tokenizer(texts, 800, tmp_path / "identity")
    assert sp.decode(sp.encode(odd)) == odd

    def pieces(rule: str) -> list[tuple[str, float]]:
        monkeypatch.setattr(tokenizer, "NORMALIZATION", rule)
        sp = tokenizer.train_tokenizer([t for pair in build_pairs(6000, seed=11) for t in pair], 1000, tmp_path / rule)
        return [(sp.sp.id_to_piece(i), sp.sp.get_score(i)) for i in range(sp.vocab_size)]

    assert pieces("identity") == pieces("nmt_nfkc")
    monkeypatch.setattr(tokenizer, "NORMALIZATION", "nmt_nfkc")
    nfkc = tokenizer.train_tokenizer(texts, 800, tmp_path / "nfkc")
    assert nfkc.decode(nfkc.encode(odd)) != odd  # the default would fail the first assertion


def test_readme_translation_table_is_the_shipped_records() -> None:
    """The README's wmt14-en-de table (BLEU of seeds 0-2, pooled NLL by position range) must be
    what the shipped records give: its NLL columns were typed in by hand before stop 65."""
    import statistics

    from pe_bench.tasks.translation.figure import parse_ranges, pooled_nll

    root = Path(__file__).resolve().parents[3]
    records = root / "results" / "reference" / "tiny-stop65"
    header = "| Position encoding | BLEU | mean NLL (nats) at target positions 0-11 / 24-35 / 36-47 / 72+ |"
    readme = (root / "README.md").read_text(encoding="utf-8")
    rows = readme[readme.index(header) :].split("\n\n")[0].splitlines()[2:]
    nll = pooled_nll(records, "wmt14-en-de", parse_ranges("0-11,24-35,36-47,72-"))
    assert sorted(row.split("|")[1].strip() for row in rows) == sorted(nll.index)
    for row in rows:
        method, bleu, losses = (cell.strip() for cell in row.strip("|").split("|"))
        scores = [
            json.loads((records / "runs" / "wmt14-en-de" / method / f"seed{seed}" / "result.json").read_text())["score"]
            for seed in range(3)
        ]
        seeds = ", ".join(f"{score:.1f}" for score in scores)
        assert bleu == f"{statistics.mean(scores):.2f} ± {statistics.stdev(scores):.2f} ({seeds})", method
        assert losses == " / ".join(f"{value:.2f}" for value in nll.loc[method]), method


def test_cape_off_the_shared_frame_is_refused(tmp_path: Path) -> None:
    """Without the shared frame the decoder prepares (mean-normalises) the whole target, so later
    target tokens move earlier logits: causality would break silently."""
    from types import SimpleNamespace

    from pe_bench.harness.config import ConfigError, load_run_config
    from pe_bench.tasks import get_task

    config = load_run_config("wmt14-en-de", "tiny", {"data": {"shared_frame_methods": []}})
    task = get_task("wmt14-en-de")(config, tmp_path)
    task.__dict__["corpus"] = SimpleNamespace(alpha=1.0)
    with pytest.raises(
        ConfigError, match="cape transforms positions per forward .* keep it in data.shared_frame_methods"
    ):
        task.frame(EncodingFactory("cape"))
    assert not task.frame(EncodingFactory("rope")).shared_frame  # no prepare of its own: fine
