"""``write_report``: one Markdown page with every section and its figures next to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pe_bench.harness.grid import store
from pe_bench.harness.reports import report, tables


@pytest.fixture(autouse=True)
def _no_task_imports(monkeypatch):
    """The tiny footnote imports every task module (torch, lightning); tested in test_tables."""
    monkeypatch.setattr(tables, "_tiny_footnote", lambda tasks: "tiny profile: small stand-ins.")


def _cell(out: Path, task: str, method: str, score: float, seed: int = 0) -> None:
    record = store.CellRecord(
        task=task, method=method, seed=seed, profile="tiny", status="ok", metric="acc",
        metric_label="Acc. (%)", higher_is_better=True, score=score,
    )  # fmt: skip
    directory = store.cell_dir(out, task, method, seed)
    store.write_record(directory, record)
    (directory / "config.yaml").write_text(f"task: {task}\nprofile: tiny\nmodel: {{depth: 4}}\nmethod: {method}\n")


def _principles() -> str:
    return "| encoding | translation-invariance |\n|---|---|\n| pape | ✓ |"


def test_report_has_every_section_and_its_figures(tmp_path):
    for method, score in (("pape", 60.0), ("rope", 55.0), ("sincos", 50.0)):
        _cell(tmp_path, "imagenet", method, score)
    (tmp_path / "bench.md").write_text("# pe-bench bench: tiny\n\n## Forward pass\n| method | ms |\n|---|---|\n")
    plot = tmp_path / "extrapolation" / "imagenet-tiny" / "figure.png"
    plot.parent.mkdir(parents=True)
    plot.write_bytes(b"\x89PNG\r\n\x1a\n")

    path = report.write_report(tmp_path, principles=_principles)

    assert path == tmp_path / "report.md"
    text = path.read_text()
    for heading in ("# pe-bench report", "## Result matrix", "## Principles", "## Efficiency", "## Extrapolation"):
        assert heading in text
    assert "## Paper comparison" in text and "pape:table1" in text
    assert "**60.00**" in text  # the result matrix, best in bold
    assert "| pape | ✓ |" in text
    assert "### pe-bench bench: tiny" in text and "#### Forward pass" in text  # embedded, headings demoted
    assert "![extrapolation/imagenet-tiny/figure.png](extrapolation/imagenet-tiny/figure.png)" in text
    assert "Not comparable" in text and "rank (paper)" in text  # tiny records: only the ranking
    assert "### The paper's table" in text and "80.60" in text
    for figure in ("matrix.png", "paper_ranks.png"):
        assert f"({report.FIGURES}/{figure})" in text
        assert (tmp_path / report.FIGURES / figure).read_bytes().startswith(b"\x89PNG")


def test_report_without_results_says_what_is_missing(tmp_path):
    text = report.write_report(tmp_path, principles=_principles).read_text()
    assert "(no results yet)" in text
    assert "No efficiency table yet" in text and "pe-bench bench --out" in text
    assert "No extrapolation figure" in text
    assert "no cell in common" in text
    assert not (tmp_path / report.FIGURES / "matrix.png").exists()
