"""The papers' own numbers as data, and ours next to them.

Each paper's published tables live in ``configs/papers/<paper>.yaml``: one entry per table
with its source (paper, table number, caption, metric, units, higher_is_better), columns
keyed by pe-bench task names (or by the table's own axis, e.g. resolutions) and rows keyed by
pe-bench method specs where one exists (the paper's label is kept beside it). Cells are
stored as printed: ``80.6``, ``"-"`` for an empty cell, ``"27.66±0.10"``, ``"18.4K"``,
``"79.9 (+3.1)"`` (a bracketed change against another table).

    load_paper_table("pape:table1")  -> DataFrame (methods x columns) with attrs for the source
    list_tables()                    -> one row per stored table
    compare(records, "pape:table1")  -> (ours next to the paper's, notes)
    render_comparison(frame, notes)  -> Markdown
    write_comparison(out, "pape:table1") -> the same, saved as out/paper_comparison_pape_table1.md/.csv
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from pe_bench.harness.grid import store

from . import tables
from .stats import kendall_tau_b

PAPERS = ("pape", "cape", "string", "sape2", "wepe")
_CELL = re.compile(
    r"^\s*(?P<value>[-+]?\d[\d,]*(?:\.\d+)?)\s*(?P<suffix>[KM])?"
    r"\s*(?:±\s*(?P<std>\d+(?:\.\d+)?))?"
    r"\s*(?:\((?P<delta>[-+]?\d+(?:\.\d+)?)\))?\s*$"
)
_EMPTY = {"-", "", "n/a", "OOM"}
_SUFFIX = {"K": 1e3, "M": 1e6}


class PaperTableError(KeyError):
    pass


def parse_cell(cell: Any) -> tuple[float, float, float]:
    """A printed cell -> (value, std, delta); NaN where absent. ``"-"`` is an empty cell."""
    nan = float("nan")
    if cell is None:
        return nan, nan, nan
    if isinstance(cell, bool):
        raise ValueError(f"not a table cell: {cell!r}")
    if isinstance(cell, int | float):
        return float(cell), nan, nan
    text = str(cell).strip()
    if text in _EMPTY:
        return nan, nan, nan
    match = _CELL.match(text)
    if match is None:
        raise ValueError(f"cannot read table cell {cell!r}")
    value = float(match["value"].replace(",", "")) * _SUFFIX.get(match["suffix"] or "", 1.0)
    std = float(match["std"]) if match["std"] else nan
    delta = float(match["delta"]) if match["delta"] else nan
    return value, std, delta


@cache
def _paper_yaml(paper: str) -> dict[str, Any]:
    if paper not in PAPERS:
        raise PaperTableError(f"unknown paper {paper!r}; known: {', '.join(PAPERS)}")
    text = resources.files("pe_bench.configs").joinpath("papers", f"{paper}.yaml").read_text()
    return yaml.safe_load(text)


def _split_ref(ref: str) -> tuple[str, str]:
    paper, sep, table = ref.partition(":")
    if not sep or not table:
        raise PaperTableError(f"paper table reference must look like 'pape:table1', got {ref!r}")
    return paper.strip().lower(), table.strip().lower()


def _table_spec(ref: str) -> tuple[dict[str, Any], dict[str, Any]]:
    paper, table = _split_ref(ref)
    data = _paper_yaml(paper)
    for spec in data["tables"]:
        if spec["id"] == table:
            return data, spec
    known = ", ".join(f"{paper}:{t['id']}" for t in data["tables"])
    raise PaperTableError(f"no table {table!r} in {paper}; known: {known}")


def table_refs() -> list[str]:
    return [f"{paper}:{spec['id']}" for paper in PAPERS for spec in _paper_yaml(paper)["tables"]]


def row_key(row: dict[str, Any]) -> str:
    """The DataFrame index of a row: the method spec, plus its setting where the paper has one."""
    setting = row.get("setting")
    return f"{row['method']} ({setting})" if setting else str(row["method"])


def load_paper_table(ref: str) -> pd.DataFrame:
    """One published table: rows keyed by method (``row_key``), columns by task/axis key.

    ``attrs`` carry the source (paper, title, file, table number, caption), metric, units,
    higher_is_better (table-wide and per column), decimals, the paper's row and column
    labels, the method and setting of each row, and the std/delta frames of the cells.
    """
    data, spec = _table_spec(ref)
    columns = [str(c["key"]) for c in spec["columns"]]
    values: dict[str, list[float]] = {}
    stds: dict[str, list[float]] = {}
    deltas: dict[str, list[float]] = {}
    for row in spec["rows"]:
        key = row_key(row)
        if key in values:
            raise ValueError(f"{ref}: duplicate row {key!r}")
        if len(row["values"]) != len(columns):
            raise ValueError(f"{ref}: row {key!r} has {len(row['values'])} cells for {len(columns)} columns")
        parsed = [parse_cell(cell) for cell in row["values"]]
        values[key] = [p[0] for p in parsed]
        stds[key] = [p[1] for p in parsed]
        deltas[key] = [p[2] for p in parsed]
    frame = pd.DataFrame.from_dict(values, orient="index", columns=columns)
    frame.index.name = "method"
    better = bool(spec.get("higher_is_better", True))
    frame.attrs.update(
        ref=f"{data['paper']}:{spec['id']}",
        paper=data["paper"],
        title=data["title"],
        source=data["source"],
        table=spec["number"],
        caption=spec["caption"],
        metric=spec["metric"],
        units=spec["units"],
        higher_is_better=better,
        decimals=int(spec.get("decimals", 1)),
        task=spec.get("task"),
        column_labels={str(c["key"]): c.get("label", c["key"]) for c in spec["columns"]},
        column_metrics={str(c["key"]): c.get("metric", "") for c in spec["columns"]},
        column_units={str(c["key"]): c.get("units", spec["units"]) for c in spec["columns"]},
        column_better={str(c["key"]): bool(c.get("higher_is_better", better)) for c in spec["columns"]},
        row_labels={row_key(r): r.get("label", r["method"]) for r in spec["rows"]},
        methods={row_key(r): str(r["method"]) for r in spec["rows"]},
        settings={row_key(r): r.get("setting") for r in spec["rows"]},
        row_notes={row_key(r): r["note"] for r in spec["rows"] if r.get("note")},
        std=pd.DataFrame.from_dict(stds, orient="index", columns=columns),
        delta=pd.DataFrame.from_dict(deltas, orient="index", columns=columns),
    )
    return frame


def list_tables() -> pd.DataFrame:
    """One row per stored table: reference, source, metric, units and size."""
    rows = []
    for paper in PAPERS:
        data = _paper_yaml(paper)
        for spec in data["tables"]:
            rows.append(
                {
                    "table": f"{paper}:{spec['id']}",
                    "paper": data["title"],
                    "number": spec["number"],
                    "caption": spec["caption"],
                    "metric": spec["metric"],
                    "units": spec["units"],
                    "higher_is_better": bool(spec.get("higher_is_better", True)),
                    "rows": len(spec["rows"]),
                    "columns": len(spec["columns"]),
                }
            )
    return pd.DataFrame(rows)


def render_paper_table(ref: str) -> str:
    """The published table as Markdown, with the paper's labels and its source line."""
    frame = load_paper_table(ref)
    attrs = frame.attrs
    shown = pd.DataFrame(index=frame.index, columns=frame.columns, dtype=object)
    for column in frame.columns:
        count = attrs["column_units"][column] == "count"
        for key in frame.index:
            value, std = frame.loc[key, column], attrs["std"].loc[key, column]
            text = f"{value:,.0f}" if count and not pd.isna(value) else _fmt(value, attrs["decimals"])
            shown.loc[key, column] = text if pd.isna(std) else f"{text} ± {std:.{attrs['decimals']}f}"
    shown = shown.rename(columns=attrs["column_labels"])
    shown.index = [f"{key} ({attrs['row_labels'][key]})" for key in frame.index]
    shown.index.name = "method (paper label)"
    return f"{_source_line(frame)}\n\n{shown.to_markdown(disable_numparse=True)}"


def _source_line(frame: pd.DataFrame) -> str:
    a = frame.attrs
    better = "higher is better" if a["higher_is_better"] else "lower is better"
    return (
        f"Source: {a['title']} ({a['source']}), Table {a['table']}: {a['caption']}. "
        f"Metric: {a['metric']} [{a['units']}], {better}."
    )


def _fmt(value: float, decimals: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{decimals}f}"


def _ranks(values: pd.Series, higher_is_better: bool) -> pd.Series:
    """1 for the best; ties share the better rank; NaN stays NaN."""
    return values.rank(method="min", ascending=not higher_is_better)


def _paper_rows_by_method(frame: pd.DataFrame) -> tuple[dict[str, str], list[str]]:
    """method -> row key; where the paper has several settings of a method, the row without a
    setting wins, else the first one (and a note says which)."""
    chosen: dict[str, str] = {}
    notes = []
    settings, methods = frame.attrs["settings"], frame.attrs["methods"]
    for key in frame.index:
        method = methods[key]
        if method not in chosen or (settings[chosen[method]] and not settings[key]):
            chosen[method] = key
    for method, key in chosen.items():
        others = [k for k in frame.index if methods[k] == method and k != key]
        if others:
            notes.append(f"{method}: the paper has {len(others) + 1} rows; compared with {key!r}.")
    return chosen, notes


COMPARISON_COLUMNS = ["task", "method", "ours", "paper", "diff", "rank_ours", "rank_paper", "n_seeds", "profile"]


def _lost_seeds(row) -> str:
    """How a cell's seeds that hold no score ended: '2 failed, 1 diverged' (or 'not run')."""
    parts = [f"{int(count)} {word}" for word, count in (("failed", row.failed), ("diverged", row.diverged)) if count]
    missing = int(row.asked) - int(row.n) - int(row.failed) - int(row.diverged)
    if missing > 0:
        parts.append(f"{missing} not run")
    return ", ".join(parts) or "none lost"


def compare(results: tables.StoredResults | Iterable[store.CellRecord], ref: str) -> tuple[pd.DataFrame, list[str]]:
    """Ours next to the paper's for the (method, task) cells both have.

    One row per shared cell: our mean over finished seeds, the paper's value, the
    difference (ours - paper), and the method's rank among the shared methods of that task in
    ours and in the paper (1 = best, respecting lower-is-better columns). ``notes`` explain
    what could not be matched, the ranking agreement per task (Kendall's τ-b with its
    p-value), cells holding fewer seeds than asked for, cells left out for another
    configuration than their task's or for a seed cut short by the time cap, and, for
    ``tiny``-profile records, that only the ranking is comparable.
    """
    results = tables.as_results(results)
    records = results.records
    paper = load_paper_table(ref)
    attrs = paper.attrs
    notes = [_source_line(paper)]
    rows_by_method, row_notes = _paper_rows_by_method(paper)
    stats = tables.summary(results)
    finished = stats["status"].isin([store.STATUS_OK, tables.STATUS_PARTIAL]) & stats["mean"].notna()
    odd = stats[finished & ~stats["config_ok"].astype(bool)]
    if len(odd):
        cells = ", ".join(f"{r.task}/{r.method}" for r in odd.itertuples())
        notes.append(f"Left out, trained in another configuration than the rest of their task: {cells}.")
    unfinished = stats[
        stats["status"].isin([store.STATUS_FAILED, store.STATUS_DIVERGED])
        & stats["task"].isin(paper.columns)
        & stats["method"].isin(rows_by_method)
    ]
    if len(unfinished):  # without this note they vanished from the rows and from τ unmentioned
        cells = ", ".join(f"{r.task}/{r.method} ({_lost_seeds(r)})" for r in unfinished.itertuples())
        notes.append(f"In the paper's table but without a finished seed here (not compared, not in τ): {cells}.")
    cut = stats[finished & stats["config_ok"].astype(bool) & stats["cut_short"].astype(bool)]
    if len(cut):  # a shorter fit's score is not the paper's schedule's
        cells = ", ".join(f"{r.task}/{r.method}" for r in cut.itertuples())
        notes.append(f"Left out, a seed's training stopped before its planned epochs (trainer.max_time): {cells}.")
    stats = stats[finished & stats["config_ok"].astype(bool) & ~stats["cut_short"].astype(bool)]
    partial = stats[stats["status"] == tables.STATUS_PARTIAL]
    if len(partial):
        cells = ", ".join(f"{r.task}/{r.method} ({r.n}/{r.asked}; {_lost_seeds(r)})" for r in partial.itertuples())
        notes.append(f"Holding fewer seeds than asked for (mean of those held): {cells}.")
    profiles: dict[tuple[str, str], str] = {}
    for r in records:
        if r.status == store.STATUS_OK:
            profiles.setdefault((r.task, r.method), r.profile)
    shared = []
    for _, s in stats.iterrows():
        if s["task"] in paper.columns and s["method"] in rows_by_method and not pd.isna(s["mean"]):
            value = paper.loc[rows_by_method[s["method"]], s["task"]]
            if pd.isna(value):
                continue
            shared.append(
                {
                    "task": s["task"],
                    "method": s["method"],
                    "ours": float(s["mean"]),
                    "paper": float(value),
                    "n_seeds": int(s["n"]),
                    "profile": profiles.get((s["task"], s["method"]), ""),
                }
            )
    computed = ("diff", "rank_ours", "rank_paper")
    frame = pd.DataFrame(shared, columns=[c for c in COMPARISON_COLUMNS if c not in computed])
    if frame.empty:
        if attrs["task"]:
            notes.append(
                f"This table's columns ({', '.join(paper.columns)}) are an axis of the {attrs['task']} task, "
                "not task names: the result matrix has nothing to set beside it."
            )
        notes.append("No cell in common: none of our (method, task) results appears in this table.")
        return pd.DataFrame(columns=COMPARISON_COLUMNS), notes
    frame["diff"] = frame["ours"] - frame["paper"]
    frame["rank_ours"] = float("nan")
    frame["rank_paper"] = float("nan")
    columns = list(paper.columns)
    methods = list(paper.index.map(attrs["methods"]))
    frame["_col"] = frame["task"].map(columns.index)
    frame["_row"] = frame["method"].map(lambda m: methods.index(m))
    frame = frame.sort_values(["_col", "_row"]).drop(columns=["_col", "_row"]).reset_index(drop=True)
    for task, group in frame.groupby("task", sort=False):
        better = attrs["column_better"][task]
        frame.loc[group.index, "rank_ours"] = _ranks(group["ours"], better)
        frame.loc[group.index, "rank_paper"] = _ranks(group["paper"], better)
        if len(group) >= 2:
            tau, p_value = kendall_tau_b(list(group["ours"]), list(group["paper"]))
            same = (frame.loc[group.index, "rank_ours"] == frame.loc[group.index, "rank_paper"]).all()
            agreement = "undefined: one side has all scores tied" if pd.isna(tau) else f"{tau:+.2f}, p = {p_value:.2g}"
            notes.append(
                f"{task}: {len(group)} methods in both; ranking "
                + ("identical" if same else "differs")
                + f" (Kendall τ-b = {agreement})."
            )
        else:
            notes.append(f"{task}: only one method in both, nothing to rank.")
    frame = frame[COMPARISON_COLUMNS]
    unmatched_methods = sorted({r.method for r in records} - set(rows_by_method))
    if unmatched_methods:
        notes.append(f"Not in the paper's table: {', '.join(unmatched_methods)}.")
    unmatched_tasks = sorted({r.task for r in records} - set(paper.columns))
    if unmatched_tasks:
        notes.append(f"Tasks not in the paper's table: {', '.join(unmatched_tasks)}.")
    notes.extend(row_notes)
    used = set(frame["profile"])
    if "tiny" in used:
        notes.insert(
            0,
            "**Not comparable: our numbers come from the `tiny` profile** (small stand-in data and models, "
            "not the paper's datasets or training). The scores and differences in this table say nothing about the "
            "paper's numbers; only the ranks can be compared.",
        )
    if used - {"tiny", "paper"}:
        notes.append(f"Profiles used: {', '.join(sorted(used))}.")
    return frame, notes


def render_comparison(frame: pd.DataFrame, notes: list[str], decimals: int = 2) -> str:
    """The comparison as a Markdown table followed by its notes."""
    if frame.empty:
        table = "(no cell in common with the paper's table)"
    else:
        shown = frame.copy()
        for column in ("ours", "paper"):
            shown[column] = shown[column].map(lambda v: _fmt(v, decimals))
        shown["diff"] = shown["diff"].map(lambda v: "-" if pd.isna(v) else f"{v:+.{decimals}f}")
        for column in ("rank_ours", "rank_paper"):
            shown[column] = shown[column].map(lambda v: "-" if pd.isna(v) else str(int(v)))
        shown = shown.rename(
            columns={
                "ours": "ours",
                "paper": "paper",
                "diff": "ours − paper",
                "rank_ours": "rank (ours)",
                "rank_paper": "rank (paper)",
                "n_seeds": "seeds",
            }
        )
        table = shown.to_markdown(index=False, disable_numparse=True)
    warnings = [note for note in notes if note.startswith("**Not comparable")]
    rest = [note for note in notes if note not in warnings]
    head = "".join(f"> {note}\n\n" for note in warnings)
    return head + table + "\n\n" + "\n".join(f"- {note}" for note in rest)


def compare_markdown(results: tables.StoredResults | Iterable[store.CellRecord], ref: str) -> str:
    frame, notes = compare(results, ref)
    return render_comparison(frame, notes, decimals=max(2, load_paper_table(ref).attrs["decimals"]))


def comparison_stem(ref: str) -> str:
    """File name (without suffix) of the comparison with ``ref``: ``paper_comparison_pape_table1``."""
    paper, table = _split_ref(ref)
    return f"paper_comparison_{paper}_{table}"


def write_comparison(out: Path, ref: str) -> str:
    """Ours (the stored cells under ``out``) next to the paper's table ``ref``, written as
    ``<out>/paper_comparison_<paper>_<table>.md`` and ``.csv``; returns the Markdown."""
    out = Path(out)
    frame, notes = compare(tables.load_results(out), ref)
    markdown = f"Ours next to `{ref}`.\n\n" + render_comparison(
        frame, notes, decimals=max(2, load_paper_table(ref).attrs["decimals"])
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{comparison_stem(ref)}.md").write_text(markdown + "\n")
    frame.to_csv(out / f"{comparison_stem(ref)}.csv", index=False)
    return markdown
