"""A grid small enough to train in seconds, for tests of the store and the grid loop."""

from __future__ import annotations

import sys
from pathlib import Path

SMALL = [
    "--set", "optim.epochs=1", "--set", "data.train_size=64", "--set", "data.val_size=32",
    "--set", "data.test_size=32", "--set", "model.dim=32", "--set", "model.depth=1",
]  # fmt: skip


def run_args(out: Path, methods: str, *extra: str) -> list[str]:
    """Arguments of ``pe-bench run`` for an imagenet grid of ``methods`` under ``out``."""
    return ["run", "--tasks", "imagenet", "--methods", methods, "--out", str(out), *SMALL, *extra]


def cli_command(*args: str) -> list[str]:
    """The command line that runs ``pe-bench`` in a separate Python process."""
    return [sys.executable, "-m", "pe_bench.harness.cli", *args]
