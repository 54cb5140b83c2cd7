"""``out/report.md``: one self-contained Markdown page of everything stored under ``out``.

Sections: the result matrix (harness/tables.py) with a bar chart, the principles table
(declared versus measured), the efficiency table when ``out/bench.md`` exists (written by
``pe-bench bench --out DIR``), the extrapolation figures found under ``out/extrapolation/``,
and ours next to the paper's for ``pape:table1``. Figures are PNG files next to the page
(``out/report_files/``), linked with relative paths so the folder can be moved as a whole.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from pe_bench.harness.grid import store

from . import papers, tables

REPORT = "report.md"
FIGURES = "report_files"
DEFAULT_PAPER_TABLE = "pape:table1"


def _principles_markdown() -> str:
    from pe_bench.harness.conformance import principles_table

    return principles_table().to_markdown()


def _matrix_figure(results: tables.StoredResults, path: Path) -> bool:
    """Grouped bars: one group per task, one bar per method (mean over seeds, std as error bar)."""
    means, stds, labels = tables.matrix(results)
    means = means.drop(columns=["Average"], errors="ignore")
    stds = stds.reindex_like(means)
    if means.empty or means.notna().sum().sum() == 0:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tasks, methods = list(means.columns), list(means.index)
    ranked = means.attrs["ranked"].reindex_like(means).fillna(False).astype(bool)
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(tasks) * max(1, len(methods)) * 0.35 + 2), 4.0))
    handles = []
    for i, method in enumerate(methods):
        xs = [t + (i - (len(methods) - 1) / 2) * width for t in range(len(tasks))]
        # No bar where there is no mean (failed, diverged, n/a: until stop 61 a bar of height
        # 0, read as a score of 0), and a hatched one for a mean the table does not rank
        # (missing seeds, another configuration), as the table marks it.
        heights, errors = means.loc[method], stds.loc[method].fillna(0.0)
        bars = ax.bar(xs, heights, width, yerr=errors, capsize=2)
        handles.append(Patch(facecolor=bars.patches[0].get_facecolor(), label=method))  # unhatched
        for bar, is_ranked in zip(bars, ranked.loc[method], strict=True):
            if not is_ranked:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels([f"{t}\n{labels.get(t, '')}" for t in tasks])
    ax.set_ylabel("score (table units)")
    ax.set_title("Result matrix: mean over seeds\n(hatched: not ranked, as marked in the table)", fontsize="medium")
    ax.legend(handles=handles, fontsize="small", ncol=min(4, len(methods)))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _comparison_figure(frame: pd.DataFrame, path: Path, title: str) -> bool:
    """Paper rank against our rank per shared cell (the diagonal is perfect agreement)."""
    if frame.empty:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.0, 4.5))
    for task, group in frame.groupby("task", sort=False):
        ax.scatter(group["rank_paper"], group["rank_ours"], label=task, s=40, alpha=0.8)
        for _, row in group.iterrows():
            ax.annotate(row["method"], (row["rank_paper"], row["rank_ours"]), fontsize=7, alpha=0.7)
    top = float(max(frame["rank_paper"].max(), frame["rank_ours"].max())) + 0.5
    ax.plot([0.5, top], [0.5, top], color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlim(0.5, top)
    ax.set_ylim(top, 0.5)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("rank in the paper (1 = best)")
    ax.set_ylabel("rank in ours (1 = best)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _demote_headings(markdown: str, levels: int = 2) -> str:
    """Embedded pages keep their structure under this page's section heading."""
    out = []
    for line in markdown.splitlines():
        if line.startswith("#"):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


def _relative(path: Path, out: Path) -> str:
    return path.relative_to(out).as_posix()


def write_report(
    out: Path,
    paper_table: str = DEFAULT_PAPER_TABLE,
    principles: Callable[[], str] | None = None,
) -> Path:
    """Write ``out/report.md`` (and its figures under ``out/report_files/``); return its path.

    ``principles`` returns the principles table as Markdown (default: measured now with
    ``conformance.principles_table()``, which takes a few seconds per encoding).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = out / FIGURES
    results = tables.load_results(out)
    records = results.records
    stored = len(records) + len(results.incomplete)
    profiles = sorted({r.profile for r in records})
    sha = store.git_sha() or "unknown"
    lines = [
        "# pe-bench report",
        "",
        f"Generated {dt.datetime.now().isoformat(timespec='seconds')} from `{out}` "
        f"({stored} stored cell(s); profile(s): {', '.join(profiles) or 'none'}; git {sha}).",
        "",
        "Contents: [Result matrix](#result-matrix) · [Principles](#principles) · [Efficiency](#efficiency) · "
        "[Extrapolation](#extrapolation) · [Paper comparison](#paper-comparison)",
        "",
        "## Result matrix",
        "",
        tables.render(results, "markdown"),
        "",
    ]
    if _matrix_figure(results, figures / "matrix.png"):
        lines += [f"![Result matrix]({FIGURES}/matrix.png)", ""]

    lines += ["## Principles", "", "Declared versus measured principles of every registered encoding.", ""]
    lines += [(principles or _principles_markdown)(), ""]

    lines += ["## Efficiency", ""]
    bench = out / "bench.md"
    if bench.is_file():
        lines += [f"From `{_relative(bench, out)}` (`pe-bench bench --out {out}`):", ""]
        lines += [_demote_headings(bench.read_text().strip()), ""]
    else:
        lines += [f"No efficiency table yet: run `pe-bench bench --out {out}` to add one.", ""]

    lines += ["## Extrapolation", ""]
    extrapolation = out / "extrapolation"
    images = sorted(extrapolation.glob("**/*.png")) if extrapolation.is_dir() else []
    if images:
        for image in images:
            name = _relative(image, out)
            lines += [f"![{name}]({name})", ""]
        others = sorted(p for p in extrapolation.glob("**/*") if p.suffix in (".md", ".pdf", ".csv"))
        if others:
            lines += ["Also: " + ", ".join(f"[{_relative(p, out)}]({_relative(p, out)})" for p in others), ""]
    else:
        lines += [f"No extrapolation figure under `{_relative(extrapolation, out)}/` yet.", ""]

    lines += ["## Paper comparison", ""]
    frame, notes = papers.compare(results, paper_table)
    decimals = max(2, papers.load_paper_table(paper_table).attrs["decimals"])
    lines += [f"Ours next to `{paper_table}` for the cells both have.", ""]
    lines += [papers.render_comparison(frame, notes, decimals=decimals), ""]
    if _comparison_figure(frame, figures / "paper_ranks.png", f"Ranks: ours vs {paper_table}"):
        lines += [f"![Ranks against {paper_table}]({FIGURES}/paper_ranks.png)", ""]
    lines += ["### The paper's table", "", papers.render_paper_table(paper_table), ""]

    report = out / REPORT
    report.write_text("\n".join(lines))
    return report
