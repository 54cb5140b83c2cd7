"""The per-duration WER table (bins.md, bins.csv) follows the result matrix's "Honest tables"
rules: the same seeds as the matrix's cell, a seed of another configuration kept and marked †,
one cut short kept and marked §, held/asked where seeds are missing, and the matrix's notes
naming the seeds and why. Until stop 71 the bins table dropped the † and § seeds and printed the
rest as a plain row (an audit: wsj rope read 41.0 beside pape's 46.0 while the matrix's rope was
47.33 ± 11.02 †, from three seeds)."""

from __future__ import annotations

import yaml

from pe_bench.harness.grid import store
from pe_bench.harness.reports import tables

LABELS = ["<1.5s", ">=1.5s", "all"]


def bins(wer: float) -> dict:
    return {
        "duration_bins": {
            "edges_seconds": [1.5],
            "labels": LABELS,
            "wer": {"test": dict.fromkeys(LABELS, wer)},
            "words": {"test": {"<1.5s": 1, ">=1.5s": 1, "all": 2}},
        }
    }


def stored(out, method, seed, wer, status="ok", lr=0.002, with_bins=True, **record):
    """One wsj cell under ``out``: its record (score = 100 × WER, as a speech cell stores it) and,
    when finished, the config.yaml the matrix checks."""
    cell = store.cell_dir(out, "wsj", method, seed)
    extra = bins(wer) if with_bins and status == "ok" else {}
    score = 100 * wer if status == "ok" else None
    store.write_record(cell, store.CellRecord("wsj", method, seed, "tiny", status, metric="wer",
                                              metric_label="WER (%)", higher_is_better=False, score=score,
                                              extra=extra, **record))  # fmt: skip
    if status == "ok":
        config = {"task": "wsj", "profile": "tiny", "method": method, "encoding": method, "options": {},
                  "model": {"dim": 64}, "optim": {"lr": lr, "epochs": 2}}  # fmt: skip
        (cell / "config.yaml").write_text(yaml.safe_dump(config))


def row(markdown: str, method: str) -> list[str]:
    """The cells of ``method``'s test row in the bins table's Markdown."""
    [line] = [line for line in markdown.splitlines() if line.startswith("| wsj") and f"| {method} " in line]
    return [cell.strip() for cell in line.strip("|").split("|")]


def pape_complete(out):
    for seed, wer in enumerate((0.45, 0.46, 0.47)):
        stored(out, "pape", seed, wer)


def test_a_seed_of_another_configuration_is_kept_and_marked_as_in_the_matrix(tmp_path):
    """The audit's case: rope seed 2 trained with optim.lr=0.01. The matrix averages all three
    seeds and marks the cell †; the bins row must hold the same three seeds, marked, with the
    footnote naming the seed and the key (it showed seeds 2, 41.0 ± 1.4, unmarked)."""
    pape_complete(tmp_path)
    for seed, wer in enumerate((0.40, 0.42, 0.60)):
        stored(tmp_path, "rope", seed, wer, lr=0.01 if seed == 2 else 0.002)
    matrix = tables.render(tables.load_results(tmp_path))
    assert "47.33 ± 11.02 †" in matrix
    [markdown] = tables.write_extra_tables(tmp_path)
    assert row(markdown, "rope") == ["wsj", "rope", "test", "3 †", "47.3 ± 11.0", "47.3 ± 11.0", "47.3 ± 11.0"]
    assert row(markdown, "pape") == ["wsj", "pape", "test", "3", "46.0 ± 1.0", "46.0 ± 1.0", "46.0 ± 1.0"]
    assert "41.0" not in markdown
    assert "† another configuration than the rest of its task" in markdown
    assert "wsj/rope/seed2: optim.lr=0.01 (others: 0.002)" in markdown
    assert "Seeds: 3 seed(s) asked for in every task (0, 1, 2)." in markdown
    assert (tmp_path / "bins.md").read_text().strip() == markdown
    csv = (tmp_path / "bins.csv").read_text()
    assert "wsj,rope,test,3 †," in csv and "wsj,pape,test,3," in csv


def test_a_partial_cell_shows_held_of_asked_and_names_the_missing_seed(tmp_path):
    """pape's seed 2 failed: the matrix shows (2/3) and says why; so does the bins table (it
    showed a bare 2 beside rope's 3)."""
    for seed, wer in enumerate((0.40, 0.42, 0.44)):
        stored(tmp_path, "rope", seed, wer)
    stored(tmp_path, "pape", 0, 0.30)
    stored(tmp_path, "pape", 1, 0.32)
    stored(tmp_path, "pape", 2, 0.0, status="failed", reason="CUDA out of memory")
    assert "31.00 ± 1.41 (2/3)" in tables.render(tables.load_results(tmp_path))
    [markdown] = tables.write_extra_tables(tmp_path)
    assert row(markdown, "pape")[:5] == ["wsj", "pape", "test", "2/3", "31.0 ± 1.4"]
    assert row(markdown, "rope")[3] == "3"
    assert "Missing seeds: wsj/pape 1 failed." in markdown


def test_a_seed_cut_short_is_kept_and_marked_with_its_schedule(tmp_path):
    """rope's seed 1 stopped by trainer.max_time after 3 of 10 epochs: the matrix keeps it and
    marks §; the bins table dropped it and showed 2 complete-looking seeds."""
    pape_complete(tmp_path)
    stored(tmp_path, "rope", 0, 0.40)
    stored(tmp_path, "rope", 1, 0.70, epochs_run=3, epochs_planned=10, stopped_by="trainer.max_time")
    stored(tmp_path, "rope", 2, 0.42)
    assert "50.67 ± 16.77 §" in tables.render(tables.load_results(tmp_path), spread_limit=float("inf"))
    [markdown] = tables.write_extra_tables(tmp_path)
    assert row(markdown, "rope")[:5] == ["wsj", "rope", "test", "3 §", "50.7 ± 16.8"]
    assert "§ a seed whose training stopped before its planned epochs" in markdown
    assert "wsj/rope/seed1: 3 of 10 epochs, stopped by trainer.max_time" in markdown


def test_a_cell_or_a_seed_without_bins_is_named_not_dropped(tmp_path):
    """A method whose every seed failed has no row; a seed that stored no bins leaves its row
    with fewer seeds than the matrix's cell: both are said under the title."""
    for seed, wer in enumerate((0.40, 0.42, 0.44)):
        stored(tmp_path, "rope", seed, wer)
    stored(tmp_path, "pape", 0, 0.30)
    stored(tmp_path, "pape", 1, 0.32)
    stored(tmp_path, "pape", 2, 0.31, with_bins=False)
    for seed in range(3):
        stored(tmp_path, "nopos", seed, 0.0, status="failed")
    [markdown] = tables.write_extra_tables(tmp_path)
    assert row(markdown, "pape")[3] == "2/3"
    assert "wsj/pape 2 of 3" in markdown
    assert "No row: wsj/nopos failed (0/3)." in markdown
