"""``pe-bench table``: the files it writes (the paper comparison included) and its options."""

from __future__ import annotations

import csv

import pytest
import yaml

from pe_bench.harness.cli import main
from pe_bench.harness.grid import store
from pe_bench.harness.reports import papers, tables


@pytest.fixture(autouse=True)
def _no_task_imports(monkeypatch):
    """The tiny footnote imports every task module (torch, lightning); tested in test_tables."""
    monkeypatch.setattr(tables, "_tiny_footnote", lambda tasks: "tiny profile: small stand-ins.")
    monkeypatch.setattr(tables, "write_extra_tables", lambda out, results=None: [])
    monkeypatch.setattr(tables, "extra_tables", lambda results: {})


def _cell(out, task, method, seed, score, status="ok", depth=4):
    record = store.CellRecord(
        task=task, method=method, seed=seed, profile="tiny", status=status, metric="acc",
        metric_label="Acc. (%)", higher_is_better=True, score=score,
    )  # fmt: skip
    directory = store.cell_dir(out, task, method, seed)
    store.write_record(directory, record)
    if status == "ok":
        config = {"task": task, "profile": "tiny", "model": {"depth": depth}, "method": method, "encoding": method}
        (directory / "config.yaml").write_text(yaml.safe_dump(config))


def _grid(out):
    for seed in (0, 1, 2):
        _cell(out, "imagenet", "pape", seed, 60.0 + seed)
        _cell(out, "imagenet", "rope", seed, 55.0 + 0.5 * seed)
        _cell(out, "imagenet", "sincos", seed, 40.0 + seed, depth=2)
    _cell(out, "imagenet", "lookhere", 0, 50.0)
    _cell(out, "imagenet", "lookhere", 1, None, status="diverged")


def test_table_writes_the_paper_comparison_beside_the_tables(tmp_path, capsys):
    _grid(tmp_path)
    for seed in (0, 1, 2):  # in the paper's table, without a finished seed: named, not dropped unsaid
        _cell(tmp_path, "imagenet", "alibi", seed, None, status="failed" if seed else "diverged")
    assert main(["table", "--out", str(tmp_path), "--paper", "pape:table1", "--ci", "95"]) == 0
    printed = capsys.readouterr().out
    for name in ("table.md", "table.tex", "table.csv", "paper_comparison_pape_table1.md"):
        assert (tmp_path / name).is_file() and name in printed
    markdown = (tmp_path / "paper_comparison_pape_table1.md").read_text()
    assert markdown.startswith("Ours next to `pape:table1`.") and "rank (paper)" in markdown
    assert "imagenet: 3 methods in both; ranking differs (Kendall τ-b = +0.33, p = 1)" in markdown
    assert "Left out, trained in another configuration than the rest of their task: imagenet/sincos." in markdown
    assert (
        "Holding fewer seeds than asked for (mean of those held): imagenet/lookhere (1/3; 1 diverged, 1 not run)."
        in markdown
    )
    assert (
        "In the paper's table but without a finished seed here (not compared, not in τ): "
        "imagenet/alibi (2 failed, 1 diverged)." in markdown
    )
    with (tmp_path / "paper_comparison_pape_table1.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["method"] for r in rows] == ["rope", "lookhere", "pape"]
    assert list(rows[0]) == papers.COMPARISON_COLUMNS
    assert "95% Student-t confidence interval" in (tmp_path / "table.md").read_text()


def test_table_options_reach_the_tables(tmp_path, capsys):
    _grid(tmp_path)
    assert main(["table", "--out", str(tmp_path), "--no-significance"]) == 0
    assert "no significance test" in (tmp_path / "table.md").read_text()
    assert not list(tmp_path.glob("paper_comparison*"))
    with pytest.raises(SystemExit) as exit_info:
        main(["table", "--out", str(tmp_path), "--ci", "150"])
    assert exit_info.value.code == 2 and "confidence level in percent, like 95" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # a fraction where percent is read
        main(["table", "--out", str(tmp_path), "--ci", "0.95"])
    assert exit_info.value.code == 2 and "would be a 0.95 % interval" in capsys.readouterr().err
    assert main(["table", "--out", str(tmp_path), "--alpha", "5"]) == 2
    assert "--alpha must lie between 0 and 1" in capsys.readouterr().err


def test_several_folders_merge_into_the_table_of_one_folder_holding_every_cell(tmp_path, capsys):
    """Columns re-run at different times (or on other machines) live in separate folders; the
    merged matrix must be exactly the one a single folder with all their cells would give, with
    the configuration check across folders (sincos's other depth stays marked)."""
    both, first, second = tmp_path / "both", tmp_path / "first", tmp_path / "second"
    _grid(both)
    _grid(first)
    for seed in (0, 1, 2):
        for out in (both, second):
            _cell(out, "cifar10", "pape", seed, 70.0 + seed)
            _cell(out, "cifar10", "rope", seed, 71.0 - seed)
    assert main(["table", "--out", str(both)]) == 0
    single = capsys.readouterr().out.split("\n(written to")[0]
    assert main(["table", "--out", str(second), "--out", str(first)]) == 0
    merged, footer = capsys.readouterr().out.split("\n(merged from 2 folders")
    assert merged == single
    assert "| cifar10 Acc. (%)" in merged.split("\n")[0] and "†" in merged
    assert "printed, not written" in footer
    assert not list(first.glob("table.*")) and not list(second.glob("table.*"))


def test_tasks_and_spread_limit_options(tmp_path, capsys):
    """--tasks prints some columns without writing files that would describe other cells than
    the folder holds; --spread-limit moves the ‡ mark; a task the records lack is an error."""
    _grid(tmp_path)
    for seed in (0, 1, 2):
        _cell(tmp_path, "cifar10", "pape", seed, 70.0 + 2 * seed)
    assert main(["table", "--out", str(tmp_path), "--tasks", "cifar10", "--spread-limit", "1.5"]) == 0
    printed = capsys.readouterr().out
    assert "cifar10 Acc. (%)" in printed and "imagenet" not in printed.split("\n")[0]
    assert "72.00 ± 2.00 ‡" in printed and f"({tmp_path}; tasks cifar10; printed, not written)" in printed
    assert not list(tmp_path.glob("table.*"))
    assert main(["table", "--out", str(tmp_path), "--tasks", "cifar100"]) == 2
    assert "no stored cell of task 'cifar100' (did you mean 'cifar10'?)" in capsys.readouterr().err
    assert main(["table", "--out", str(tmp_path)]) == 0
    assert "‡" not in capsys.readouterr().out  # default limit 3: pape's std 2.0 is within it


def test_a_cell_stored_in_two_merged_folders_is_an_error_naming_both(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    _grid(first)
    _cell(second, "imagenet", "rope", 1, 99.0)
    assert main(["table", "--out", str(first), "--out", str(second)]) == 2
    err = capsys.readouterr().err
    assert f"imagenet/rope/seed1 is stored in both {first} and {second}" in err
    assert main(["table", "--out", str(first), "--out", str(tmp_path / "typo")]) == 2
    assert f"{tmp_path / 'typo'} has no results" in capsys.readouterr().err
