"""``python -m pe_bench.harness.grid.cell REQUEST.json TASK METHOD SEED [--threads N]``: run one
cell of a grid in this process (what ``--jobs`` starts per cell). Exit status 0 when the cell
is finished (ok or n/a), 1 when it failed or diverged (its record says why)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .executor import GRID_PID_VARIABLE, run_cell_entry


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def stop_when_grid_is_gone(grid_pid: int, poll: float = 2.0) -> threading.Thread:
    """Interrupt this cell, as Ctrl-C does (nothing of it is kept, its lock is released), once
    the grid process that started it is gone. A grid killed with SIGKILL cannot stop its
    cells; without this they trained on unseen, holding CPU cores and their cells' locks.
    Call from the main thread (it installs Python's SIGINT handler, which a process started in
    the background may lack)."""
    import _thread

    signal.signal(signal.SIGINT, signal.default_int_handler)

    def watch() -> None:
        while _alive(grid_pid):
            time.sleep(poll)
        _thread.interrupt_main()

    watcher = threading.Thread(target=watch, name="grid-watchdog", daemon=True)
    watcher.start()
    return watcher


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pe_bench.harness.grid.cell")
    parser.add_argument("request", type=Path)
    parser.add_argument("task")
    parser.add_argument("method")
    parser.add_argument("seed", type=int)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    payload = json.loads(args.request.read_text())
    if os.environ.get(GRID_PID_VARIABLE):
        stop_when_grid_is_gone(int(os.environ[GRID_PID_VARIABLE]))
    status = run_cell_entry(payload, (args.task, args.method, args.seed), args.threads)
    print(f"{args.task} · {args.method} · seed {args.seed}: {status}")
    return 0 if status in ("ok", "n/a") else 1


if __name__ == "__main__":
    sys.exit(main())
