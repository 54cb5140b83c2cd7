"""Small CLI commands: listings and the papers' tables."""

from __future__ import annotations

from pe_bench.harness.cli import main


def test_list_tasks_and_methods(capsys):
    assert main(["list", "tasks"]) == 0
    out = capsys.readouterr().out
    assert "imagenet" in out and "coco" in out and "(not implemented yet)" in out and "pape-table1" in out
    assert main(["list", "methods"]) == 0
    out = capsys.readouterr().out
    assert "pape" in out and "lookhere" in out and "grids only" in out


def test_papers_listing_and_one_table(capsys):
    assert main(["papers"]) == 0
    assert "pape:table5" in capsys.readouterr().out
    assert main(["papers", "pape:table5"]) == 0
    assert "74.9" in capsys.readouterr().out  # PaPE at 1024² without interpolation


def test_table_with_paper_comparison_on_no_results(tmp_path, capsys):
    assert main(["table", "--out", str(tmp_path), "--paper", "pape:table1"]) == 0
    assert "(no results yet)" in capsys.readouterr().out


def test_principles_takes_method_specs_with_options(capsys):
    """The spec string is parsed once; its options reach the measurement (was: KeyError)."""
    assert main(["principles", "--methods", "pape[m=4],nopos"]) == 0
    out = capsys.readouterr().out
    assert "pape[m=4]" in out and "nopos" in out
