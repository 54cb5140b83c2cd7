"""BLEU and chrF by the corpus' text form: raw text (the tiny corpus) gets sacreBLEU's standard
scores; fairseq's Moses-tokenised WMT'14 gets tokenised BLEU (multi-bleu.perl's count over the
text's own tokens, as CAPE Table 2) and standard chrF, not 13a run over Moses tokens."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import sacrebleu
from torch import nn

from pe_bench.harness.config import ConfigError, load_run_config
from pe_bench.tasks import get_task
from pe_bench.tasks.translation.module import DecodingConfig, TranslationModule, corpus_scores, moses_characters
from pe_bench.tasks.translation.task import TranslationDataConfig

# Raw sentences and what Moses' tokenizer.perl -a -l de makes of them (as fairseq's preparation).
RAW_REFS = [
    "Die Euro-Zone wächst im kommenden Jahr nicht, sagte der Minister am Montag.",
    "„Wir sind's\", sagte Müller & Partner [laut Bericht].",
]
MOSES_REFS = [
    "Die Euro @-@ Zone wächst im kommenden Jahr nicht , sagte der Minister am Montag .",
    "„ Wir sind &apos; s &quot; , sagte Müller &amp; Partner &#91; laut Bericht &#93; .",
]
RAW_HYPS = [
    "Die Euro-Zone wächst nicht im nächsten Jahr, sagte ein Minister.",
    '„Wir sind es", sagte Müller & Partner [laut Bericht].',
]
MOSES_HYPS = [
    "Die Euro @-@ Zone wächst nicht im nächsten Jahr , sagte ein Minister .",
    "„ Wir sind es &quot; , sagte Müller &amp; Partner &#91; laut Bericht &#93; .",
]


def multi_bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU over whitespace tokens, as Moses' multi-bleu.perl counts it (one reference)."""
    matches, totals, hyp_length, ref_length = [0] * 4, [0] * 4, 0, 0
    for hyp, ref in zip(hypotheses, references, strict=True):
        h, r = hyp.split(), ref.split()
        hyp_length, ref_length = hyp_length + len(h), ref_length + len(r)
        for n in range(1, 5):
            h_grams = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            r_grams = Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum((h_grams & r_grams).values())
            totals[n - 1] += max(len(h) - n + 1, 0)
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4
    brevity = min(0.0, 1.0 - ref_length / hyp_length)
    return 100.0 * math.exp(log_precision + brevity)


def test_moses_text_gets_tokenised_bleu_over_its_own_tokens():
    bleu, _ = corpus_scores(MOSES_HYPS, MOSES_REFS, "moses")
    assert bleu == pytest.approx(multi_bleu(MOSES_HYPS, MOSES_REFS), abs=1e-9)
    # 13a over the Moses tokens splits each "@-@" into three tokens that match for free (and
    # "&apos;" into three more): a third number, neither tokenised BLEU nor standard sacreBLEU.
    hybrid = sacrebleu.corpus_bleu(MOSES_HYPS, [MOSES_REFS]).score
    standard = sacrebleu.corpus_bleu(RAW_HYPS, [RAW_REFS]).score
    assert len({round(bleu, 6), round(hybrid, 6), round(standard, 6)}) == 3


def test_moses_text_gets_the_standard_chrf_of_the_untokenised_text():
    assert [moses_characters(line).replace(" ", "") for line in MOSES_REFS] == [r.replace(" ", "") for r in RAW_REFS]
    _, chrf = corpus_scores(MOSES_HYPS, MOSES_REFS, "moses")
    assert chrf == pytest.approx(sacrebleu.corpus_chrf(RAW_HYPS, [RAW_REFS]).score, abs=1e-9)


def test_raw_text_keeps_sacrebleus_standard_scores():
    standard = (sacrebleu.corpus_bleu(RAW_HYPS, [RAW_REFS]).score, sacrebleu.corpus_chrf(RAW_HYPS, [RAW_REFS]).score)
    assert corpus_scores(RAW_HYPS, RAW_REFS) == corpus_scores(RAW_HYPS, RAW_REFS, "raw") == standard


@pytest.mark.parametrize("task", ["wmt14-en-de", "wmt14-en-fr"])
def test_the_paper_profiles_read_moses_text_and_the_tiny_ones_raw_text(task):
    tasks = {profile: get_task(task)(load_run_config(task, profile, {}), None) for profile in ("tiny", "paper")}
    forms = {profile: t.data.text for profile, t in tasks.items()}
    assert forms == {"tiny": "raw", "paper": "moses"}


@pytest.mark.parametrize("text", ["raw", "moses"])
def test_the_module_scores_validation_and_test_by_its_text_form(text):
    optim = load_run_config("wmt14-en-de", "tiny", {}).optim
    module = TranslationModule(nn.Identity(), None, optim, DecodingConfig(), [], 1, text=text)  # scoring only
    assert module.scores(MOSES_HYPS, MOSES_REFS) == corpus_scores(MOSES_HYPS, MOSES_REFS, text)


def test_the_tiny_corpus_cannot_be_declared_tokenised():
    with pytest.raises(ValueError, match="the tiny corpus is raw text"):
        TranslationDataConfig(source="tiny", text="moses")
    with pytest.raises(ConfigError, match="data.text"):
        get_task("wmt14-en-de")(load_run_config("wmt14-en-de", "tiny", {"data": {"text": "moses"}}), None)
