"""The papers' tables as data: loading, numbers against the paper texts, ours-vs-paper layout."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from pe_bench.harness.grid import store
from pe_bench.harness.reports import papers

PAPERS_DIR = Path(os.environ.get("PE_BENCH_PAPERS", Path(__file__).resolve().parents[2].parent / "shared" / "papers"))


def rec(task, method, seed, score, profile="paper", status="ok", higher=True):
    return store.CellRecord(
        task=task, method=method, seed=seed, profile=profile, status=status, metric="acc",
        metric_label="Acc. (%)", higher_is_better=higher, score=score,
    )  # fmt: skip


@pytest.mark.parametrize("ref", papers.table_refs())
def test_every_table_loads_with_its_source(ref):
    frame = papers.load_paper_table(ref)
    assert not frame.empty and frame.index.is_unique and frame.columns.is_unique
    for key in ("paper", "title", "source", "table", "caption", "metric", "units", "higher_is_better"):
        assert frame.attrs[key] not in (None, ""), key
    assert (PAPERS_DIR / frame.attrs["source"]).name.endswith(".txt")
    assert frame.notna().to_numpy().any()


def test_the_required_tables_are_all_there():
    refs = set(papers.table_refs())
    wanted = {f"pape:table{i}" for i in range(1, 8)}
    wanted |= {"cape:table1", "cape:table2", "cape:table3", "string:table2", "sape2:table1", "sape2:table2"}
    wanted |= {"wepe:table3", "wepe:table4"}
    assert wanted <= refs
    listing = papers.list_tables()
    assert set(listing["table"]) == refs and (listing["rows"] > 0).all()


def test_methods_and_tasks_use_pe_bench_names():
    t1 = papers.load_paper_table("pape:table1")
    assert list(t1.index) == ["sincos", "rope", "rope-mixed", "alibi", "lookhere", "pape", "pape-ri"]
    assert list(t1.columns)[:8] == [
        "imagenet", "coco", "scannet", "modelnet40", "ucf101", "dvsgesture", "gen1", "nuscenes",
    ]  # fmt: skip
    assert t1.attrs["row_labels"]["alibi"].startswith("nD-ALiBi")
    assert math.isnan(t1.loc["lookhere", "coco"]) is False and math.isnan(t1.loc["lookhere", "scannet"])
    string = papers.load_paper_table("string:table2")
    assert {"string-cayley", "string-circulant", "rope-mixed"} <= set(string.index)
    sape2 = papers.load_paper_table("sape2:table1")
    assert {"sape2", "abspos", "rope"} <= set(sape2.index) and list(sape2.columns) == ["cifar10", "cifar100"]
    wepe = papers.load_paper_table("wepe:table4")
    assert wepe.loc["wepe", "imagenet"] == 70.10
    cape = papers.load_paper_table("cape:table3")
    assert cape.loc["sinpos (train 224²)", "imagenet@224"] == 81.32  # CAPE's own 2-D sinpos keeps its name


def test_cells_as_printed():
    assert papers.parse_cell("27.66±0.10")[:2] == (27.66, 0.10)
    assert papers.parse_cell("18.4K")[0] == pytest.approx(18400)
    assert papers.parse_cell("13.6M")[0] == pytest.approx(13.6e6)
    value, _, delta = papers.parse_cell("79.9 (+3.1)")
    assert (value, delta) == (79.9, 3.1)
    assert math.isnan(papers.parse_cell("-")[0])
    with pytest.raises(ValueError):
        papers.parse_cell("about 5")
    t6 = papers.load_paper_table("pape:table6")
    t5 = papers.load_paper_table("pape:table5")
    # Table 6's brackets are the change against Table 5 (up to the paper's rounding).
    change = (t6 - t5).drop(columns="224")
    assert (change - t6.attrs["delta"].drop(columns="224")).abs().max().max() <= 0.15
    wmt = papers.load_paper_table("cape:table2")
    assert wmt.attrs["std"].loc["relpos (6L-6L)", "wmt14-en-de"] == 0.07


def _numbers(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"(?<![\w^{])[-+]?\d+\.\d+", line)]


def _text_line(paper: str, startswith: str, after: str | None = None) -> str:
    lines = (PAPERS_DIR / f"{paper}.txt").read_text().splitlines()
    start = 0
    if after is not None:
        start = next(i for i, line in enumerate(lines) if after in line)
    return next(line for line in lines[start:] if line.strip().startswith(startswith))


needs_texts = pytest.mark.skipif(not PAPERS_DIR.is_dir(), reason="paper texts not found")

# (table, row key, paper name, line prefix in the text, anchor the line comes after)
SAMPLES = [
    ("pape:table1", "pape", "pape", "PaPE (ours)", "Table 1:"),
    ("pape:table1", "rope-mixed", "pape", "RoPE-Mixed", "Table 1:"),
    ("pape:table1", "sincos", "pape", "nD-sincos", "Table 1:"),
    ("pape:table5", "lookhere", "pape", "LookHere", "Table 5:"),
    ("pape:table5", "sincos", "pape", "nD-sincos", "Table 5:"),
    ("pape:table6", "pape-ri", "pape", "PaPE-RI", "Table 6:"),
    ("pape:table7", "rope", "pape", "RoPE (Su", "Table 7:"),
    ("cape:table1", "cape[max_scale=1] (UniViT, r=384)", "cape", "UniViT, CAPE\t384", "Table 1:"),
    ("cape:table3", "cape (train 224²)", "cape", "CAPE\t", "CAPE, $\\epsilon = 0$\t"),
    ("cape:table3", "abspos (ViT-Ti, train 224²)", "cape", "abspos-Ti", "Table 3:"),
    ("string:table2", None, "string", "ImageNet\t", "RoPE-M\tCirculant-S"),
    ("sape2:table1", "sape2", "sape2", "SaPE <sup>2</sup>\t", "Table 1:"),
    ("sape2:table2", "SaPE² (Q) + APE", "sape2", "SaPE <sup>2</sup> (Q)", "Table 2:"),
    ("wepe:table4", None, "wepe", "| ImageNet-1k | 100%", "| Dataset | Frac."),
]


@needs_texts
@pytest.mark.parametrize(("ref", "row", "paper", "prefix", "after"), SAMPLES)
def test_sample_numbers_match_the_paper_text(ref, row, paper, prefix, after):
    table = papers.load_paper_table(ref)
    printed = _numbers(_text_line(paper, prefix, after))
    if row is None:  # the paper prints this table transposed: the line is one of our columns
        column = {"string:table2": "imagenet", "wepe:table4": "imagenet"}[ref]
        ours = list(table[column])
    else:
        deltas = table.attrs["delta"].loc[row]
        ours = [x for v, d in zip(table.loc[row], deltas, strict=True) for x in (v, d) if not pd.isna(x)]
    assert ours == pytest.approx(printed, abs=1e-9)


@needs_texts
def test_pape_tables_3_and_4_and_wmt_against_the_text():
    lines = (PAPERS_DIR / "pape.txt").read_text().splitlines()
    acc = next(line for line in lines if line.startswith("Accuracy 77.1"))
    assert list(papers.load_paper_table("pape:table3")["imagenet"]) == _numbers(acc)
    ablation = papers.load_paper_table("pape:table2")["imagenet"]
    start = next(i for i, line in enumerate(lines) if line.startswith("Table 2:"))
    assert list(ablation) == [_numbers(line)[-1] for line in lines[start + 2 : start + 8]]
    times = next(line for line in lines if line.startswith("Time (ms) 1.7"))
    assert list(papers.load_paper_table("pape:table4")["time_ms"].iloc[4:]) == _numbers(times)
    wmt = (PAPERS_DIR / "cape.txt").read_text()
    for value in papers.load_paper_table("cape:table2").stack().dropna():
        assert f"{value:.2f}±" in wmt


def test_compare_layout_diff_and_ranks():
    records = [
        rec("imagenet", "pape", 0, 81.0), rec("imagenet", "pape", 1, 81.4),
        rec("imagenet", "rope", 0, 80.9), rec("imagenet", "sincos", 0, 79.0),
        rec("coco", "pape", 0, 30.0), rec("coco", "rope", 0, 31.0),
        rec("imagenet", "nopos", 0, 50.0),  # not in the paper's table
        rec("wsj", "pape", 0, 12.0, higher=False),  # not a column of the paper's table
    ]  # fmt: skip
    frame, notes = papers.compare(records, "pape:table1")
    assert list(frame.columns) == papers.COMPARISON_COLUMNS
    assert list(zip(frame["task"], frame["method"], strict=True)) == [
        ("imagenet", "sincos"), ("imagenet", "rope"), ("imagenet", "pape"), ("coco", "rope"), ("coco", "pape"),
    ]  # fmt: skip
    pape = frame[(frame.task == "imagenet") & (frame.method == "pape")].iloc[0]
    assert pape["ours"] == pytest.approx(81.2) and pape["paper"] == 80.6
    assert pape["diff"] == pytest.approx(0.6) and pape["n_seeds"] == 2
    imagenet = frame[frame.task == "imagenet"].set_index("method")
    assert imagenet["rank_ours"].to_dict() == {"sincos": 3, "rope": 2, "pape": 1}
    assert imagenet["rank_paper"].to_dict() == {"sincos": 3, "rope": 2, "pape": 1}
    coco = frame[frame.task == "coco"].set_index("method")
    assert coco["rank_ours"].to_dict() == {"rope": 1, "pape": 2}
    assert coco["rank_paper"].to_dict() == {"rope": 2, "pape": 1}
    text = "\n".join(notes)
    assert "imagenet: 3 methods in both; ranking identical (Kendall τ-b = +1.00, p = 0.33)" in text
    assert "coco: 2 methods in both; ranking differs (Kendall τ-b = -1.00, p = 1)" in text
    assert "nopos" in text and "wsj" in text and "Not comparable" not in text
    markdown = papers.render_comparison(frame, notes)
    assert "| task" in markdown and "ours − paper" in markdown and "+0.60" in markdown and "80.60" in markdown


def test_lower_is_better_columns_rank_ascending():
    frame, _ = papers.compare([rec("time_ms", "rope", 0, 2.0), rec("time_ms", "sincos", 0, 3.0)], "pape:table4")
    ranks = frame.set_index("method")
    assert ranks.loc["rope", "rank_ours"] == 1 and ranks.loc["sincos", "rank_ours"] == 2
    assert ranks.loc["sincos", "rank_paper"] == 1 and ranks.loc["rope", "rank_paper"] == 2


def test_tiny_profile_says_only_the_ranking_is_comparable():
    records = [rec("imagenet", "pape", 0, 40.0, profile="tiny"), rec("imagenet", "rope", 0, 45.0, profile="tiny")]
    frame, notes = papers.compare(records, "pape:table1")
    assert set(frame["profile"]) == {"tiny"}
    assert "Not comparable" in notes[0] and "only the ranks can be compared" in notes[0]
    assert "Not comparable" in papers.render_comparison(frame, notes)


def test_failed_cells_and_empty_overlap():
    frame, notes = papers.compare([rec("imagenet", "pape", 0, None, status="failed")], "pape:table1")
    assert frame.empty and any("No cell in common" in n for n in notes)
    frame, notes = papers.compare([rec("imagenet", "pape", 0, 70.0)], "pape:table5")
    assert frame.empty and any("axis of the imagenet task" in n for n in notes)
    assert "no cell in common" in papers.render_comparison(frame, notes)


def test_rows_with_settings_pick_one_and_say_so():
    frame, notes = papers.compare([rec("wmt14-en-de", "sincos", 0, 20.0)], "cape:table2")
    assert frame.iloc[0]["paper"] == 27.66  # MT's sinpos is Vaswani's 1-D sinusoid: sincos
    assert any("sincos (6L-6L)" in n for n in notes)


def test_unknown_references_are_errors():
    with pytest.raises(KeyError):
        papers.load_paper_table("pape:table99")
    with pytest.raises(KeyError):
        papers.load_paper_table("nosuchpaper:table1")
    with pytest.raises(KeyError):
        papers.load_paper_table("pape")


def test_a_cell_cut_short_by_the_time_cap_is_left_out_and_named():
    """The score of a fit that trainer.max_time stopped early is not the paper's schedule's."""
    cut = rec("imagenet", "rope", 0, 80.9)
    cut.epochs_run, cut.epochs_planned, cut.stopped_by = 3.0, 40, "trainer.max_time"
    records = [rec("imagenet", "pape", 0, 81.0), cut, rec("imagenet", "sincos", 0, 79.0)]
    frame, notes = papers.compare(records, "pape:table1")
    assert list(frame["method"]) == ["sincos", "pape"]
    assert any("stopped before its planned epochs" in n and "imagenet/rope" in n for n in notes)


def test_cape_univit_rows_are_the_lambda_one_model():
    """Table 1's UniViT CAPE numbers (81.26 / 82.55) are Table 3's "UniViT, CAPE, λ = 1" row,
    not its plain "UniViT, CAPE" (81.16 / 82.28): cape[max_scale=1], not cape's default 1.4."""
    table = papers.load_paper_table("cape:table1")
    assert table.loc["cape[max_scale=1] (UniViT, r=224)", "top1"] == 81.26
    assert table.loc["cape[max_scale=1] (UniViT, r=384)", "top1"] == 82.55
    assert not any(row.startswith("cape (UniViT") for row in table.index)
