"""A cell of a ``--jobs`` grid stops when its grid process is gone (e.g. killed with SIGKILL)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from pe_bench.harness.grid.cell import stop_when_grid_is_gone


def test_the_cell_is_interrupted_once_the_grid_process_dies():
    grid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    previous = signal.getsignal(signal.SIGINT)
    try:
        stop_when_grid_is_gone(grid.pid, poll=0.05)
        time.sleep(0.3)  # alive grid: nothing happens
        # The kill and the reaping belong inside the block: the watchdog sees the process gone
        # as soon as wait() reaps it and may interrupt before wait() returns; outside the block
        # that KeyboardInterrupt escaped the test and stopped the whole pytest session (CI, once).
        with pytest.raises(KeyboardInterrupt):
            grid.kill()
            grid.wait()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        grid.kill()
        grid.wait()
        signal.signal(signal.SIGINT, previous)
