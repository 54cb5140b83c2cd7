"""Figure 8 of CAPE across methods: per-position loss curves of every finished cell.

Each translation cell writes ``position_nll.csv``; this overlays them, one curve per method
(mean over seeds), smoothed with a running mean so that long stacked targets stay
readable, or with ``--pooled`` prints the loss pooled over ranges of positions, the
README's translation table. Usage::

    python -m pe_bench.tasks.translation.figure RESULTS_DIR [--task wmt14-en-de]
    python -m pe_bench.tasks.translation.figure RESULTS_DIR --pooled 0-11,24-35,36-47,72-
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import pandas as pd


def read_tables(out: Path, task: str) -> pd.DataFrame:
    """Every finished cell's ``position_nll.csv`` in one frame, with its method and seed
    directory as columns; an error naming the expected files when there is none. Finished:
    the cell's result.json says ok with a finite score (a diverged cell's test may have
    written the file; the results folder's own reader is the application's, above tasks)."""
    frames = [
        pd.read_csv(table).assign(method=table.parent.parent.name, seed=table.parent.name)
        for table in sorted((out / "runs" / task).glob("*/seed*/position_nll.csv"))
        if _finished(table.parent)
    ]
    if not frames:
        raise FileNotFoundError(f"no {out}/runs/{task}/*/seed*/position_nll.csv: run the task first")
    return pd.concat(frames, ignore_index=True)


def _finished(cell: Path) -> bool:
    try:
        record = json.loads((cell / "result.json").read_text())
    except (OSError, ValueError):
        return False
    score = record.get("score")
    return record.get("status") == "ok" and isinstance(score, (int, float)) and math.isfinite(score)


def read_curves(out: Path, task: str) -> dict[str, list[list[float]]]:
    """method -> per-seed lists of mean NLL by position."""
    curves: dict[str, list[list[float]]] = defaultdict(list)
    for (method, _), cell in read_tables(out, task).groupby(["method", "seed"], sort=True):
        curves[method].append(cell.sort_values("position").mean_nll.tolist())
    return dict(curves)


def parse_ranges(text: str) -> list[tuple[int, int | None]]:
    """ "0-11,72-" -> [(0, 11), (72, None)]: inclusive target positions, an open end for "72-"."""
    ranges = []
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        if not sep or not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"position range {part!r}: write FIRST-LAST or FIRST- (e.g. 0-11,72-)")
        ranges.append((int(first), int(last) if last else None))
    return ranges


def pooled_nll(out: Path, task: str, ranges: list[tuple[int, int | None]]) -> pd.DataFrame:
    """method x range: mean NLL per target token at those positions over every seed's stacked
    test sentences (each position's mean weighted by how many sentences reach it, so a long
    tail that few sentences reach counts as the tokens it has)."""
    rows = read_tables(out, task)
    columns = {}
    for first, last in ranges:
        inside = rows[(rows.position >= first) & (rows.position <= (last if last is not None else rows.position.max()))]
        tokens = inside.assign(total=inside.mean_nll * inside["count"]).groupby("method")[["total", "count"]].sum()
        columns[f"{first}-{'' if last is None else last}"] = tokens.total / tokens["count"]
    return pd.DataFrame(columns)


def running_mean(values: list[float], width: int) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - width + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


def plot(out: Path, task: str, train_max: int | None = None, width: int = 5) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = read_curves(out, task)
    fig, ax = plt.subplots(figsize=(7, 4))
    for method, seeds in sorted(curves.items()):
        n = min(len(s) for s in seeds)
        mean = [sum(s[i] for s in seeds) / len(seeds) for i in range(n)]
        ax.plot(running_mean(mean, width), lw=1.2, label=f"{method} ({len(seeds)} seed{'s' * (len(seeds) > 1)})")
    if train_max:
        ax.axvline(train_max, color="grey", ls="--", lw=1, label="longest training target")
    ax.set_xlabel("target position (subword tokens)")
    ax.set_ylabel(f"mean NLL (running mean over {width})")
    ax.set_title(f"{task}: loss per position on stacked test sentences")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = out / f"{task}-position-nll.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--task", default="wmt14-en-de")
    parser.add_argument("--train-max", type=int, default=None, help="draw the longest training target")
    parser.add_argument("--pooled", metavar="RANGES", help="print the NLL pooled over position ranges, e.g. 0-11,72-")
    args = parser.parse_args(argv)
    if args.pooled:
        print(pooled_nll(args.out, args.task, parse_ranges(args.pooled)).round(2).to_markdown())
    else:
        print(plot(args.out, args.task, args.train_max))


if __name__ == "__main__":
    main()
