"""Figure 8 of CAPE across methods: per-position loss curves of every finished cell.

Each translation cell writes ``position_nll.csv``; this overlays them, one curve per method
(mean over seeds), smoothed with a running mean so that long stacked targets stay
readable. Usage::

    python -m pe_bench.tasks.translation.figure RESULTS_DIR [--task wmt14-en-de]
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path


def read_curves(out: Path, task: str) -> dict[str, list[list[float]]]:
    """method -> per-seed lists of mean NLL by position."""
    curves: dict[str, list[list[float]]] = defaultdict(list)
    for table in sorted((out / "runs" / task).glob("*/seed*/position_nll.csv")):
        with table.open() as handle:
            rows = list(csv.DictReader(handle))
        curves[table.parent.parent.name].append([float(r["mean_nll"]) for r in rows])
    return dict(curves)


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
    if not curves:
        raise FileNotFoundError(f"no {out}/runs/{task}/*/seed*/position_nll.csv: run the task first")
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
    args = parser.parse_args(argv)
    print(plot(args.out, args.task, args.train_max))


if __name__ == "__main__":
    main()
