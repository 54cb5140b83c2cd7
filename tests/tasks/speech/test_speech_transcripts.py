"""Transcript normalisation: Kaldi's markup tokens are dropped from references and training
targets (not turned into the words "noise" and "unk"), everything else is lower-cased letters
and apostrophes; the tiny corpus has no markup, so its transcripts are what they were."""

from __future__ import annotations

import pytest
from torchmetrics.text import WordErrorRate

from pe_bench.tasks.speech.corpus import VOCABULARY
from pe_bench.tasks.speech.readers import MARKUP_TOKEN, normalise_transcript, read_manifest

KALDI_LINES = {
    # Kaldi WSJ text (egs/wsj/s5, normalize_transcript.pl: [loud_breath] etc. -> <NOISE>)
    "<NOISE> THE COMPANY SAID <NOISE> IT WILL KEEP ITS HOT HAND": "the company said it will keep its hot hand",
    "A TEST <SPOKEN_NOISE> OF THE SYSTEM.": "a test of the system",
    # Kaldi TED-LIUM text (egs/tedlium/s5_r3, prepare_data.sh: {NOISE} -> [NOISE], <unk> kept)
    "and i think that 's [NOISE] <unk> really important": "and i think that 's really important",
    "so [laughter] {NOISE} {BREATH} we [<door_slam] began": "so we began",
    "[NOISE]": "",
}


@pytest.mark.parametrize(("line", "words"), KALDI_LINES.items())
def test_kaldi_markup_tokens_are_dropped_not_spelled(line, words):
    assert normalise_transcript(line) == words


def test_a_perfect_recogniser_scores_zero_wer_on_kaldi_references():
    spoken = {line: words for line, words in KALDI_LINES.items() if words}
    references = [normalise_transcript(line) for line in spoken]
    hypotheses = list(spoken.values())  # a recogniser that outputs the spoken words, no markup
    assert float(WordErrorRate()(hypotheses, references)) == 0.0


def test_brackets_inside_a_word_and_punctuation_still_follow_the_alphabet_rule():
    # Only a whole token in brackets is markup; other characters outside the alphabet are spaces.
    assert normalise_transcript("it's  A test, (really)\tdone") == "it's a test really done"
    assert normalise_transcript("x<y> [partial]word") == "x y partial word"


def test_manifest_transcripts_lose_their_markup(tmp_path):
    (tmp_path / "test.tsv").write_text("a.flac\t1.0\t<NOISE> HELLO [NOISE] WORLD <unk>\n")
    (record,) = read_manifest(tmp_path, "test")
    assert record.text == "hello world"


def test_the_tiny_corpus_has_no_markup_so_its_transcripts_are_unchanged():
    assert not [word for word in VOCABULARY if MARKUP_TOKEN.fullmatch(word)]
    sentence = " ".join(VOCABULARY)
    assert normalise_transcript(sentence) == sentence
