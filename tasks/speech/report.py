"""The per-duration-bin WER table (CAPE Figures 5-6 as numbers), next to the result matrix.

Reads the ``duration_bins`` that every finished speech cell stores in its record's
``extra``: one row per (task, method, evaluation set), one column pair per duration bin plus
overall, WER in % as mean and sample std over seeds (as the result matrix). The application
writes it as ``<out>/bins.md`` and ``<out>/bins.csv``.

The seeds are the result matrix's (harness/reports/tables.extra_tables hands over every seed a
matrix cell averages, a ``†`` or ``§`` seed included), and ``seeds`` counts those a row holds;
tables.extra_tables then shows it as the matrix shows the cell (``held/asked``, ``†``, ``§``) and
adds the matrix's notes naming the seeds and why. Until stop 71 the ``†`` and ``§`` seeds were
dropped here and the rest read as a plain complete row: wsj rope with seed 2 trained at another
learning rate read 41.0 beside pape's 46.0, while the matrix's rope was 47.33 ± 11.02 †.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd


def bin_rows(records: list[Any], task: str | None = None) -> tuple[list[str], list[dict]]:
    """(bin labels, rows) with per-bin mean/std of WER in % over the seeds of each method, from
    finished cells (objects with ``task``, ``method``, ``seed``, ``extra``): every record given,
    whatever its configuration or schedule (the caller gives the matrix's seeds and marks them);
    ``seeds``: how many of them hold the row's bins."""
    labels: list[str] = []
    values: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    seeds: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for record in records:
        bins = record.extra.get("duration_bins")
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


def bins_table(records: list[Any]) -> pd.DataFrame | None:
    """The table as numbers: ``WER <bin>_mean`` / ``WER <bin>_std`` column pairs (the writer
    renders each pair as "mean ± std") beside ``task``, ``method`` and ``seeds``, the columns
    tables.extra_tables reads to mark each row as the matrix marks its cell; None when no cell
    has bins."""
    labels, rows = bin_rows(records)
    if not rows:
        return None
    flat = []
    for row in rows:
        entry = {"task": row["task"], "method": row["method"], "eval set": row["eval_set"], "seeds": row["seeds"]}
        for label in labels:
            mean, std = row[label] if row[label] is not None else (None, None)
            entry[f"WER {label}_mean"], entry[f"WER {label}_std"] = mean, std
        flat.append(entry)
    frame = pd.DataFrame(flat)
    frame.attrs["title"] = "WER (%) by utterance duration (lower is better)"
    return frame
