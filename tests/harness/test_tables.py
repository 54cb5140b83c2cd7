"""The result matrix: mean ± std, best bold, next-best underlined, n/a, lower-is-better."""

from __future__ import annotations

from pe_bench.harness.grid import store
from pe_bench.harness.reports.tables import matrix, render, write_tables


def rec(task, method, seed, score, status="ok", higher=True, label="Acc. (%)"):
    return store.CellRecord(
        task=task, method=method, seed=seed, profile="tiny", status=status, metric="acc",
        metric_label=label, higher_is_better=higher, score=score,
    )  # fmt: skip


def test_mean_std_bold_and_underline():
    records = [
        rec("imagenet", "pape", 0, 90.0), rec("imagenet", "pape", 1, 92.0),
        rec("imagenet", "rope", 0, 85.0), rec("imagenet", "rope", 1, 87.0),
        rec("imagenet", "nopos", 0, 12.0), rec("imagenet", "nopos", 1, 14.0),
    ]  # fmt: skip
    text = render(records)
    assert "**91.00 ± 1.41**" in text
    assert "<u>86.00 ± 1.41</u>" in text
    assert "13.00 ± 1.41" in text and "**13.00" not in text and "<u>13.00" not in text
    latex = render(records, "latex")
    assert r"\textbf{91.00 $\pm$ 1.41}" in latex and r"\underline{86.00 $\pm$ 1.41}" in latex and "toprule" in latex


def test_lower_is_better_columns_rank_ascending_and_stay_out_of_the_average():
    records = [
        rec("wsj", "pape", 0, 20.0, higher=False, label="WER (%)"),
        rec("wsj", "rope", 0, 30.0, higher=False, label="WER (%)"),
        rec("wsj", "nopos", 0, 60.0, higher=False, label="WER (%)"),
        rec("imagenet", "pape", 0, 80.0), rec("imagenet", "rope", 0, 90.0), rec("imagenet", "nopos", 0, 10.0),
    ]  # fmt: skip
    text = render(records)
    assert "**20.00**" in text and "<u>30.00</u>" in text
    means, _, _ = matrix(records)
    assert means.loc["rope", "Average"] == 90.0  # only higher-is-better columns are averaged
    assert "wsj WER (%) ↓" in text


def test_not_applicable_and_failed_cells():
    records = [
        rec("imagenet", "pape", 0, 80.0),
        rec("imagenet", "lookhere", 0, None, status="n/a"),
        rec("imagenet", "rope", 0, None, status="failed"),
    ]
    text = render(records)
    assert "n/a" in text and "failed" in text
    means, _, _ = matrix(records)
    assert means["Average"].isna()["lookhere"]


def test_tables_written_from_stored_records_only(tmp_path):
    store.write_record(store.cell_dir(tmp_path, "imagenet", "pape", 0), rec("imagenet", "pape", 0, 70.0))
    store.write_record(store.cell_dir(tmp_path, "imagenet", "rope", 0), rec("imagenet", "rope", 0, 60.0))
    markdown = write_tables(tmp_path)
    assert "**70.00**" in markdown and "tiny profile" in markdown
    for name in ("table.md", "table.tex", "table.csv"):
        assert (tmp_path / name).stat().st_size > 0
    assert "imagenet,pape" in (tmp_path / "table.csv").read_text()
