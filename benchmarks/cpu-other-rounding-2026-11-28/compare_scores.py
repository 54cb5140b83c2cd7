"""Final scores of a `make run` results folder against the shipped seed-0 records, with the
records' spread over seeds beside each difference: how far a machine that rounds differently
lands from the records, in units of seed noise.

    python benchmarks/cpu-other-rounding-2026-11-28/compare_scores.py RESULTS_DIR
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from pe_bench.harness.grid import store

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"


def reference_scores() -> dict[tuple[str, str], dict[int, float]]:
    """(task, method) -> {seed: score} over every finished record of results/reference."""
    scores: dict[tuple[str, str], dict[int, float]] = {}
    for path in REFERENCE.glob(f"*/runs/*/*/seed*/{store.RECORD}"):
        record = store.read_record(path.parent)
        if record.status == store.STATUS_OK:
            scores.setdefault((record.task, record.method), {})[record.seed] = record.score
    return scores


def main(results: Path) -> None:
    reference = reference_scores()
    differences, in_stds = [], []
    for path in sorted(results.glob(f"runs/*/*/seed0/{store.RECORD}")):
        now = store.read_record(path.parent)
        seeds = reference[now.task, now.method]
        std = statistics.stdev(seeds[s] for s in (0, 1, 2))
        difference = now.score - seeds[0]
        differences.append(difference)
        in_stds.append(abs(difference) / std)
        print(
            f"{now.task:12s} {now.method:5s} record {seeds[0]:8.3f} now {now.score:8.3f} "
            f"diff {difference:+7.3f}  std(seeds 0-2) {std:6.3f}  |diff|/std {in_stds[-1]:4.2f}"
        )
    print(
        f"{len(differences)} cells, {sum(d == 0 for d in differences)} equal; median |diff| "
        f"{statistics.median(map(abs, differences)):.3f}, max {max(map(abs, differences)):.3f}; |diff|/std median "
        f"{statistics.median(in_stds):.2f}, max {max(in_stds):.2f}, above 1 in {sum(r > 1 for r in in_stds)}"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
