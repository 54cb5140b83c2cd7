"""Small CLI commands: listings and the papers' tables."""

from __future__ import annotations

import re

from pe_bench.harness.cli import main


def test_list_tasks_and_methods(capsys):
    assert main(["list", "tasks"]) == 0
    out = capsys.readouterr().out
    for task in ("imagenet", "coco", "gen1", "nuscenes"):  # every column of PaPE Table 1 is implemented
        assert re.search(rf"^{task} +profiles: tiny, paper", out, re.MULTILINE), out
    assert "(not implemented yet)" not in out and "pape-table1" in out
    assert main(["list", "methods"]) == 0
    out = capsys.readouterr().out
    assert "pape" in out and "lookhere" in out and "grids only" in out


def test_papers_listing_and_one_table(capsys):
    assert main(["papers"]) == 0
    assert "pape:table5" in capsys.readouterr().out
    assert main(["papers", "pape:table5"]) == 0
    assert "74.9" in capsys.readouterr().out  # PaPE at 1024² without interpolation


def test_table_of_a_folder_without_results_is_an_error(tmp_path, capsys):
    # a mistyped --out used to print an empty table and succeed
    assert main(["table", "--out", str(tmp_path / "typo"), "--paper", "pape:table1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "typo has no results (no runs/ folder)" in captured.err
    (tmp_path / "runs").mkdir()
    assert main(["table", "--out", str(tmp_path)]) == 2
    assert "holds no readable results" in capsys.readouterr().err


def test_empty_method_or_seed_selection_is_an_error(tmp_path, capsys):
    for selection in (["--methods", ",", "--seeds", "0"], ["--methods", "rope", "--seeds", ""]):
        code = main(["run", "--tasks", "imagenet", *selection, "--out", str(tmp_path)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "selects no" in err, err
    assert not (tmp_path / "runs").exists()


def test_principles_takes_method_specs_with_options(capsys):
    """The spec string is parsed once; its options reach the measurement (was: KeyError)."""
    assert main(["principles", "--methods", "pape[m=4],nopos"]) == 0
    out = capsys.readouterr().out
    assert "pape[m=4]" in out and "nopos" in out


def test_bench_kernel_flags_choose_the_fused_functions_for_the_run(monkeypatch):
    """``--rotation-kernel``, ``--cope-kernel`` and ``--widening-kernel`` hold for the whole
    command, then "auto" again."""
    from pe_bench.adapters.cope import FUSED_COPE
    from pe_bench.adapters.pape import FUSED_WIDENING
    from pe_bench.adapters.rope import FUSED_ROTATION
    from pe_bench.harness import cli

    functions = (FUSED_ROTATION, FUSED_COPE, FUSED_WIDENING)
    seen = []
    monkeypatch.setattr(cli, "_bench", lambda args: seen.append(tuple(f.choice for f in functions)) or 0)
    assert main(["bench", "--rotation-kernel", "eager", "--cope-kernel", "fused", "--widening-kernel", "eager"]) == 0
    assert seen == [("eager", "fused", "eager")]
    assert tuple(f.choice for f in functions) == ("auto", "auto", "auto")
