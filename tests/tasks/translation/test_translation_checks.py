"""Parallel text in fairseq's layout: encoding errors name file and line, ``pe-bench
check-data`` reads every split."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_task_translation import write_corpus

from pe_bench.harness.cli import main
from pe_bench.tasks._shared.data_checks import CorruptFileError
from pe_bench.tasks.translation.io import read_split

PAIRS = [("Hello world.", "Hallo Welt."), ("Two.", "Zwei.")]


def test_a_line_that_is_not_utf8_is_named_with_file_and_line(tmp_path: Path) -> None:
    write_corpus(tmp_path, PAIRS)
    broken = tmp_path / "valid.de"
    broken.write_bytes(b"Hallo Welt.\n" + "Zwei \xfc.\n".encode("latin-1"))
    with pytest.raises(CorruptFileError, match=rf"^{broken}: line 2 is not UTF-8 text"):
        read_split(tmp_path, "valid", "en", "de")


def test_check_data_reads_every_split(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "wmt14_en_de", PAIRS)
    argv = ["check-data", "--tasks", "wmt14-en-de", "--data-root", str(tmp_path), "--workers", "2"]
    assert main(argv) == 0
    assert "wmt14-en-de: 6 files checked, ok" in capsys.readouterr().out
    (tmp_path / "wmt14_en_de" / "test.de").write_text("Hallo Welt.\n")
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "wmt14-en-de: 6 files checked, 1 broken" in out and "test.en has 2 lines but" in out
