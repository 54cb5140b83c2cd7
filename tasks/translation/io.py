"""Readers for parallel text in the layout fairseq's WMT'14 preparation produces.

One folder per language pair holding ``{train,valid,test}.{src,tgt}`` plain-text files,
one sentence per line, line i of ``*.en`` translating line i of ``*.de``:

    <data-root>/wmt14_en_de/train.en  train.de  valid.en  valid.de  test.en  test.de

What fairseq's examples/translation/prepare-wmt14en2de.sh (en-fr: prepare-wmt14en2fr.sh),
run without its BPE step, puts there:

* every file is Moses-tokenised with aggressive hyphen splitting and escapes (tokenizer.perl
  ``-a``: "Euro @-@ Zone", "nicht , sagte", "&quot;"), so the paper profiles say
  ``data.text: moses`` and report tokenised BLEU (:func:`.module.corpus_scores`);
* train: Europarl, Common Crawl and News Commentary (en-fr: also UN and Gigaword), with
  normalised punctuation, through Moses' clean-corpus-n.perl (pairs of 1-250 tokens, length
  ratio <= 1.5; the script runs it after BPE, so on subwords);
* valid: **not** newstest2013. The script sets ``dev=dev/newstest2013`` but never uses it: valid
  is every 100th line of the tokenised training corpus (en-fr: every 1333rd), taken out of
  train and cleaned as train is. CAPE Section 5.3 validates DE on newstest2013 and FR on "the
  provided valid file" (fairseq's, presumably this one); for CAPE's DE setting, put newstest2013, tokenised the same
  way, in valid.{en,de};
* test: newstest2014 (the full 3003 sentences of test-full), "’" replaced by "'" and
  tokenised, not cleaned.

pe-bench never downloads WMT: a missing or malformed folder is an error naming the path, the
layout and where the data comes from.
"""

from __future__ import annotations

from pathlib import Path

from pe_bench.harness.data import DatasetMissingError

from .._shared.data_checks import CorruptFileError

SPLITS = ("train", "valid", "test")


def layout_help(folder: Path, src: str, tgt: str) -> str:
    files = "  ".join(f"{s}.{src} {s}.{tgt}" for s in SPLITS)
    return (
        f"Expected layout: {folder}/ with {files}\n"
        "(plain text, one sentence per line, the two files of a split line-aligned).\n"
        f"Source: WMT'14 {src}-{tgt} (https://www.statmt.org/wmt14/translation-task.html), "
        "prepared as in fairseq's examples/translation/prepare-wmt14en2de.sh (en-fr: prepare-wmt14en2fr.sh), "
        "without the BPE step: pe-bench trains its own sentencepiece model. That text is Moses-tokenised "
        "(data.text: moses); untokenised text needs data.text: raw."
    )


def check_folder(folder: Path, src: str, tgt: str) -> None:
    missing = [
        f"{split}.{lang}" for split in SPLITS for lang in (src, tgt) if not (folder / f"{split}.{lang}").is_file()
    ]
    if missing:
        raise DatasetMissingError(
            f"parallel corpus not found: {folder} lacks {', '.join(missing)}.\n{layout_help(folder, src, tgt)}"
        )


def read_lines(path: Path) -> list[str]:
    try:
        with path.open(encoding="utf-8") as handle:
            return [line.rstrip("\n").strip() for line in handle]
    except UnicodeDecodeError as err:
        raise CorruptFileError(path, f"line {first_undecodable_line(path)} is not UTF-8 text ({err.reason})") from None


def first_undecodable_line(path: Path) -> int:
    """1-based number of the first line that is not UTF-8 (looked for only after a failure)."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


def check_split(item: tuple[Path, str, str, str]) -> None:
    """Full scan: both files of a split decode and are line-aligned."""
    read_split(*item)


def read_split(folder: Path, split: str, src: str, tgt: str) -> list[tuple[str, str]]:
    """Line-aligned (source, target) pairs; pairs with an empty side are dropped (as fairseq's clean step)."""
    check_folder(folder, src, tgt)
    sources, targets = read_lines(folder / f"{split}.{src}"), read_lines(folder / f"{split}.{tgt}")
    if len(sources) != len(targets):
        raise DatasetMissingError(
            f"malformed parallel corpus: {folder / f'{split}.{src}'} has {len(sources)} lines but "
            f"{folder / f'{split}.{tgt}'} has {len(targets)}.\n{layout_help(folder, src, tgt)}"
        )
    return [(s, t) for s, t in zip(sources, targets, strict=True) if s and t]
