"""The result matrix, built with pandas from the stored records only.

Methods as rows, tasks as columns (metric named in the header), mean ± std over seeds,
best in bold and next-best underlined per column (respecting lower-is-better metrics),
an Average column over higher-is-better columns for methods that have all of them, and
n/a where the encoding is not defined for the task. Markdown, LaTeX (booktabs) and CSV.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pe_bench.harness.grid import store


def records_frame(records: list[store.CellRecord]) -> pd.DataFrame:
    rows = [
        {
            "task": r.task,
            "method": r.method,
            "seed": r.seed,
            "profile": r.profile,
            "status": r.status,
            "metric": r.metric_label,
            "higher_is_better": r.higher_is_better,
            "score": r.score,
        }
        for r in records
    ]
    return pd.DataFrame(
        rows, columns=["task", "method", "seed", "profile", "status", "metric", "higher_is_better", "score"]
    )


def summary(records: list[store.CellRecord]) -> pd.DataFrame:
    """One row per (task, method): mean, std, n of successful seeds, and the cell status."""
    frame = records_frame(records)
    if frame.empty:
        return pd.DataFrame(columns=["task", "method", "metric", "higher_is_better", "mean", "std", "n", "status"])
    grouped = frame.groupby(["task", "method"], sort=False)
    out = grouped.agg(
        metric=("metric", "first"),
        higher_is_better=("higher_is_better", "first"),
        mean=("score", "mean"),
        std=("score", "std"),
        n=("score", "count"),
        status=("status", lambda s: "ok" if (s == "ok").any() else s.iloc[0]),
        failed=("status", lambda s: int(s.isin([store.STATUS_FAILED, store.STATUS_DIVERGED]).sum())),
    )
    return out.reset_index()


def _ranks(values: pd.Series, higher_is_better: bool) -> pd.Series:
    """1 for the best, 2 for the next-best (ties share a rank), NaN for missing."""
    rounded = values.round(2)
    return rounded.rank(method="dense", ascending=not higher_is_better)


def _column_order(stats: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(stats["task"]))


def matrix(records: list[store.CellRecord]) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """(means, stds) frames with methods as rows and task columns, plus column -> metric label."""
    stats = summary(records)
    tasks = _column_order(stats)
    methods = list(dict.fromkeys(stats["method"]))
    means = stats.pivot(index="method", columns="task", values="mean").reindex(index=methods, columns=tasks)
    stds = stats.pivot(index="method", columns="task", values="std").reindex(index=methods, columns=tasks)
    status = stats.pivot(index="method", columns="task", values="status").reindex(index=methods, columns=tasks)
    labels = dict(zip(stats["task"], stats["metric"], strict=False))
    better = dict(zip(stats["task"], stats["higher_is_better"], strict=False))
    averaged = [t for t in tasks if better.get(t, True)]
    if averaged:
        complete = means[averaged].notna().all(axis=1)
        means["Average"] = means[averaged].mean(axis=1).where(complete)
        stds["Average"] = float("nan")
        status["Average"] = "ok"
        better["Average"] = True
        labels["Average"] = ""
    means.attrs.update(status=status, better=better)
    return means, stds, labels


def _cell_text(mean: float, std: float, status: str, bold: bool, under: bool, fmt: str) -> str:
    if status == store.STATUS_NA:
        return "n/a"
    if pd.isna(mean):
        return "failed" if status in (store.STATUS_FAILED, store.STATUS_DIVERGED) else "-"
    text = f"{mean:.2f}" if pd.isna(std) else f"{mean:.2f} ± {std:.2f}"
    if fmt == "latex":
        text = text.replace("±", r"$\pm$")
        if bold:
            return rf"\textbf{{{text}}}"
        if under:
            return rf"\underline{{{text}}}"
        return text
    if bold:
        return f"**{text}**"
    if under:
        return f"<u>{text}</u>"
    return text


def render(records: list[store.CellRecord], fmt: str = "markdown") -> str:
    means, stds, labels = matrix(records)
    if means.empty:
        return "(no results yet)"
    status, better = means.attrs["status"], means.attrs["better"]
    cells = pd.DataFrame(index=means.index, columns=means.columns, dtype=object)
    for column in means.columns:
        ranks = _ranks(means[column], better.get(column, True))
        n_ranked = means[column].notna().sum()
        for method in means.index:
            rank = ranks[method]
            cells.loc[method, column] = _cell_text(
                means.loc[method, column],
                stds.loc[method, column],
                status.loc[method, column] if isinstance(status.loc[method, column], str) else "",
                bold=n_ranked > 1 and rank == 1,
                under=n_ranked > 2 and rank == 2,
                fmt=fmt,
            )
    header = {c: f"{c} {labels[c]}{'' if better.get(c, True) else ' ↓'}".strip() for c in cells.columns}
    cells = cells.rename(columns=header)
    cells.index.name = "Position encoding"
    profiles = sorted({r.profile for r in records})
    if fmt == "latex":
        body = cells.to_latex(escape=False, column_format="l" + "c" * len(cells.columns))
        return body
    table = cells.to_markdown()
    notes = [
        f"Profile: {', '.join(profiles)}. Mean ± std over seeds (a value without ± is one seed); "
        "best in bold, next-best underlined."
    ]
    if "tiny" in profiles:
        notes.append(_tiny_footnote(sorted({r.task for r in records})))
    return table + "\n\n" + "\n".join(notes)


def _tiny_footnote(tasks: list[str]) -> str:
    from pe_bench.tasks import get_task

    parts = []
    for name in tasks:
        try:
            standin = get_task(name).tiny_standin
        except KeyError:
            continue
        if standin:
            parts.append(f"{name}: {standin}")
    return "tiny profile: small stand-ins, not the real datasets - " + "; ".join(parts) + "."


def write_tables(out: Path) -> str:
    """Write table.md, table.tex and table.csv under ``out`` and return the Markdown."""
    out = Path(out)
    records = store.load_records(out)
    markdown = render(records, "markdown")
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(markdown + "\n")
    (out / "table.tex").write_text(render(records, "latex"))
    summary(records).to_csv(out / "table.csv", index=False)
    return markdown


def render_extra_table(frame: pd.DataFrame) -> str:
    """Markdown of a task's extra table: each ``X_mean``/``X_std`` column pair becomes one
    column ``X`` reading "mean ± std" (the mean alone for a single seed, "-" when empty)."""
    shown = pd.DataFrame(index=frame.index)
    for column in frame.columns:
        if column.endswith("_std") and f"{column[:-4]}_mean" in frame.columns:
            continue
        if column.endswith("_mean") and f"{column[:-5]}_std" in frame.columns:
            means, stds = frame[column], frame[f"{column[:-5]}_std"]
            shown[column[:-5]] = [
                "-" if pd.isna(m) else (f"{m:.1f} ± {s:.1f}" if s and s > 0 else f"{m:.1f}")
                for m, s in zip(means, stds, strict=True)
            ]
        else:
            shown[column] = frame[column]
    title = frame.attrs.get("title")
    table = shown.to_markdown(index=False, disable_numparse=True)
    return f"{title}\n\n{table}" if title else table


def write_extra_tables(out: Path, records: list[store.CellRecord]) -> list[str]:
    """Every task's own tables (``Task.extra_tables``) as ``<out>/<name>.md`` and ``.csv``;
    returns their Markdown. A table that several tasks share is written once."""
    from pe_bench.tasks import get_task, implemented

    finished = [r for r in records if r.status == store.STATUS_OK]
    written: dict[str, str] = {}
    for name in sorted({r.task for r in finished} & set(implemented())):
        for table_name, frame in get_task(name).extra_tables(finished).items():
            if table_name in written:
                continue
            written[table_name] = render_extra_table(frame)
            (Path(out) / f"{table_name}.md").write_text(written[table_name] + "\n")
            frame.to_csv(Path(out) / f"{table_name}.csv", index=False)
    return list(written.values())
