"""The shipped records must be what today's code trains: a change that moves an encoding's
numbers, even at rounding level, leaves the README's matrix showing runs that `pe-bench run`
no longer gives (stops 33-41 moved 24 cells' training that way unnoticed until stop 43-44's
`pe-bench reproduce`). So one seed-0 record per encoding, on a task chosen so that every task
is checked too, is trained again for one epoch here and compared bit for bit. A sample, not the
whole check: `pe-bench reproduce results/reference/* --seeds 0` trains the first epoch of every
seed-0 record (126 cells, about 25 minutes on 2 cores).

Bits are defined only on the arithmetic the records were trained with: the test runs where
torch and the CPU kernels are those of the records (x86-64 with AVX-512, torch 2.14.1, one
thread per cell, and not a CPU known to round differently: ``OTHER_ARITHMETIC_CPUS``) and is
skipped elsewhere, where `pe-bench reproduce` shows how far a machine is.
When it fails after a change you meant, retrain the encoding's column (every task, seeds 0-5)
and replace its records: the README says how (`results/reference`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pe_bench.harness.grid import store
from pe_bench.harness.grid.reproduce import reproduce_cell

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference"

#: the task each encoding's record is checked on: every encoding once and every task at least once
#: (a change can move an encoding's numbers on one kind of positions only: stops 39-41 moved
#: string-cayley's on modelnet40 and scannet, not on imagenet or ucf101), cheap tasks where a choice
#: is left (one epoch: ucf101 about 3 s, imagenet and modelnet40 6 s, coco, gen1, wmt14-en-de and
#: nuscenes 10-20 s)
SENTINEL_TASK = {
    "abspos": "imagenet",
    "alibi": "modelnet40",
    "cape": "scannet",
    "cope": "ucf101",
    "lookhere": "imagenet",
    "nopos": "wmt14-en-de",
    "pape": "gen1",
    "pape-ri": "nuscenes",
    "relpos": "coco",
    "rope": "ucf101",
    "rope-mixed": "ucf101",
    "sape2": "imagenet",
    "sincos": "modelnet40",
    "string-cayley": "wsj",
    "string-circulant": "dvsgesture",
    "wepe": "imagenet",
}

RECORDS_CPU = "AVX512"  # torch.backends.cpu.get_cpu_capability() where the records were trained
RECORDS_TORCH = "2.14.1"
#: CPUs (``store.cpu_model``) whose kernels round differently from the records' machine
#: although torch and the capability above are the same: the records' bits are not defined
#: there. Family 6 model 207 (stop 53, 2026-11-28; AMX and AVX512-FP16, L3 300 MiB):
#: `pe-bench reproduce results/reference/* --seeds 0 --methods nopos` gave 3 identical, 7
#: differ, at the HEAD of stop 52, whose CI had passed on another machine (train losses 1e-7
#: apart after one epoch; nuscenes 1e-3). A denylist, not an allowlist: the records predate
#: env.json's ``cpu_model``, so their own CPU is unknown, and this keeps the check running
#: wherever they may reproduce (a CPU in this list cannot be the records' machine).
OTHER_ARITHMETIC_CPUS = {"family 6 model 207"}


def _other_arithmetic() -> str | None:
    """Why this machine's bits cannot be the records', or None."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != RECORDS_CPU or not torch.__version__.startswith(RECORDS_TORCH):
        return f"this is torch {torch.__version__} on {capability}"
    if store.cpu_model() in OTHER_ARITHMETIC_CPUS:
        return f"this CPU ({store.cpu_model()}) rounds differently with them"
    return None


same_arithmetic = pytest.mark.skipif(
    _other_arithmetic() is not None,
    reason=f"the records' bits are those of torch {RECORDS_TORCH} on {RECORDS_CPU} CPU kernels of the records' "
    f"machine; {_other_arithmetic()} (`pe-bench reproduce` compares anyway)",
)


def seed0_cells() -> dict[tuple[str, str], Path]:
    """(task, encoding) -> the seed-0 cell of the README's 3-seed matrix (one per pair: a
    retrained cell's old record is removed from its folder; the folders of seeds 3-5 hold no seed 0)."""
    cells: dict[tuple[str, str], Path] = {}
    for record in sorted(REFERENCE.glob("*/runs/*/*/seed0/result.json")):
        task, method = record.parts[-4], record.parts[-3]
        assert (task, method) not in cells, f"two seed-0 records of {task} · {method}: {cells[task, method]}, {record}"
        cells[task, method] = record.parent
    return cells


def test_every_encoding_of_the_matrix_has_a_sentinel() -> None:
    cells = seed0_cells()
    assert {method for _, method in cells} == set(SENTINEL_TASK), "give a new encoding its sentinel task here"
    assert {task for task, _ in cells} == set(SENTINEL_TASK.values()), "a task of the matrix has no sentinel"
    for method, task in SENTINEL_TASK.items():
        assert store.read_record(cells[task, method]).status == store.STATUS_OK, (task, method)


@pytest.mark.slow
@same_arithmetic
@pytest.mark.parametrize("method", sorted(SENTINEL_TASK))
def test_a_shipped_record_is_what_todays_code_trains(method: str) -> None:
    cell = seed0_cells()[SENTINEL_TASK[method], method]
    result = reproduce_cell(cell, epochs=1)
    assert not result.skipped, result.skipped
    assert result.identical, (
        f"{result.label}: today's code no longer trains the shipped record {cell.relative_to(ROOT)} "
        f"({'; '.join(result.differences)}). If the change is meant, retrain the {method} column (every task, "
        "seeds 0-5) into a new results/reference folder and remove its old records; if not, it is a regression."
    )
