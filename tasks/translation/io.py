"""Readers for parallel text in the layout fairseq's WMT'14 preparation produces.

One folder per language pair holding ``{train,valid,test}.{src,tgt}`` plain-text files,
one sentence per line, line i of ``*.en`` translating line i of ``*.de``:

    <data-root>/wmt14_en_de/train.en  train.de  valid.en  valid.de  test.en  test.de

(valid = newstest2013 for DE, the provided "valid" file for FR; test = newstest2014, as
CAPE Section 5.3.) pe-bench never downloads WMT: a missing or malformed folder is an
error naming the path, the layout and where the data comes from.
"""

from __future__ import annotations

from pathlib import Path

from pe_bench.harness.data import DatasetMissingError

SPLITS = ("train", "valid", "test")


def layout_help(folder: Path, src: str, tgt: str) -> str:
    files = "  ".join(f"{s}.{src} {s}.{tgt}" for s in SPLITS)
    return (
        f"Expected layout: {folder}/ with {files}\n"
        "(plain text, one sentence per line, the two files of a split line-aligned).\n"
        f"Source: WMT'14 {src}-{tgt} (https://www.statmt.org/wmt14/translation-task.html), "
        "prepared as in fairseq's examples/translation/prepare-wmt14en2de.sh (en-fr: prepare-wmt14en2fr.sh), "
        "without the BPE step: pe-bench trains its own sentencepiece model."
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
    with path.open(encoding="utf-8") as handle:
        return [line.rstrip("\n").strip() for line in handle]


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
