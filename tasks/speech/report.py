"""The per-duration-bin WER table (CAPE Figures 5-6 as numbers), next to the result matrix.

Reads the ``duration_bins`` that every finished speech cell stores in its record's
``extra`` and writes ``<out>/bins.md`` and ``<out>/bins.csv``: one row per (task, method,
evaluation set), one column per duration bin plus overall, WER in % as mean ± sample std over
seeds (as the result matrix).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from pe_bench.harness.grid import store


def bin_rows(records: list[store.CellRecord], task: str | None = None) -> tuple[list[str], list[dict]]:
    """(bin labels, rows) with per-bin mean/std of WER in % over the seeds of each method."""
    labels: list[str] = []
    values: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    seeds: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for record in records:
        bins = record.extra.get("duration_bins") if record.status == store.STATUS_OK else None
        if not bins or (task is not None and record.task != task):
            continue
        labels = labels or list(bins["labels"])
        for eval_set, per_bin in bins["wer"].items():
            key = (record.task, record.method, eval_set)
            seeds[key].add(record.seed)
            for label, wer in per_bin.items():
                if wer is not None:
                    values[key][label].append(100.0 * wer)
    rows = []
    for key in sorted(values):
        row = {"task": key[0], "method": key[1], "eval_set": key[2], "seeds": len(seeds[key])}
        for label in labels:
            got = values[key].get(label, [])
            # Sample std (ddof 1) as the result matrix; 0 for a single seed.
            row[label] = (float(np.mean(got)), float(np.std(got, ddof=1)) if len(got) > 1 else 0.0) if got else None
        rows.append(row)
    return labels, rows


def _cell(value: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    mean, std = value
    return f"{mean:.1f} ± {std:.1f}" if std > 0 else f"{mean:.1f}"


def write_bin_tables(out: Path, task: str | None = None) -> str | None:
    """Write bins.md and bins.csv under ``out`` (all speech tasks); None when no cell has bins."""
    out = Path(out)
    labels, rows = bin_rows(store.load_records(out), None)
    if not rows:
        return None
    header = ["task", "method", "eval set", "seeds", *[f"WER {b}" for b in labels]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    csv = [",".join(["task", "method", "eval_set", "seeds", *[f"{b}_{s}" for b in labels for s in ("mean", "std")]])]
    for row in rows:
        cells = [row["task"], row["method"], row["eval_set"], str(row["seeds"]), *(_cell(row[b]) for b in labels)]
        lines.append("| " + " | ".join(cells) + " |")
        nums = [f"{v:.4f}" if row[b] else "" for b in labels for v in (row[b] or (0.0, 0.0))]
        csv.append(",".join([row["task"], f'"{row["method"]}"', row["eval_set"], str(row["seeds"]), *nums]))
    markdown = "WER (%) by utterance duration (lower is better)\n\n" + "\n".join(lines)
    (out / "bins.md").write_text(markdown + "\n")
    (out / "bins.csv").write_text("\n".join(csv) + "\n")
    return markdown
