"""``python -m pe_bench.harness.grid.cell REQUEST.json TASK METHOD SEED [--threads N]``: run one
cell of a grid in this process (what ``--jobs`` starts per cell). Exit status 0 when the cell
is finished (ok or n/a), 1 when it failed or diverged (its record says why)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .executor import run_cell_entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pe_bench.harness.grid.cell")
    parser.add_argument("request", type=Path)
    parser.add_argument("task")
    parser.add_argument("method")
    parser.add_argument("seed", type=int)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    payload = json.loads(args.request.read_text())
    status = run_cell_entry(payload, (args.task, args.method, args.seed), args.threads)
    print(f"{args.task} · {args.method} · seed {args.seed}: {status}")
    return 0 if status in ("ok", "n/a") else 1


if __name__ == "__main__":
    sys.exit(main())
