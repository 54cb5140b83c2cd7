"""Host waits per training step of every task's tiny profile (``harness/reports/host_sync.py``'s
``task_training_waits``: the model's forward, loss and backward on the first training batch),
with the pe-bench lines that make them, for rope and pape. The figures in the README's
"Host waits per training step"; what they cost on a GPU is not measured here.

    python benchmarks/cpu-host-syncs-2026-11-28/task_waits.py [task,task,...]
"""

from __future__ import annotations

import sys
from collections import Counter

from pe_bench.harness.reports.host_sync import task_training_waits
from pe_bench.tasks import resolve_tasks

METHODS = ("rope", "pape")


def main(spec: str) -> None:
    print("| task | method | waits | by line |")
    print("|:--|:--|--:|:--|")
    for task in resolve_tasks(spec):
        for method in METHODS:
            try:
                syncs = task_training_waits(task, method).syncs
            except ValueError as error:  # n/a
                print(f"| {task} | {method} | n/a | {error} |", flush=True)
                continue
            lines = Counter(sync.source for sync in syncs).most_common()
            where = ", ".join(f"{line} ×{count}" for line, count in lines)
            print(f"| {task} | {method} | {len(syncs)} | {where} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
