"""The shipped records must be what today's code trains: a change that moves an encoding's
numbers, even at rounding level, leaves the README's matrix showing runs that `pe-bench run`
no longer gives (stops 33-41 moved 24 cells' training that way unnoticed until stop 43-44's
`pe-bench reproduce`). So one seed-0 record per encoding, on a task chosen so that every task
is checked too, is trained again for one epoch here and compared bit for bit. A sample, not the
whole check: `pe-bench reproduce results/reference/* --seeds 0` trains the first epoch of every
seed-0 record (126 cells, about 25 minutes on 2 cores).

Bits are defined only on the arithmetic the records were trained with: the test runs where
torch and the CPU kernels are those of the records (x86-64 with AVX-512, torch 2.14.1, one
thread per cell, and not a CPU known to round differently: ``OTHER_ARITHMETIC_CPUS``).
On a CPU of that list, the sentinels' first epochs are compared instead with what that CPU
made of them at code that reproduced the records on their own machine (``OTHER_CPU_ROWS``:
the same training, rounded by this CPU), so a change of the records' training is caught there
too. Elsewhere the test is skipped, and `pe-bench reproduce` shows how far a machine is.
When it fails after a change you meant, retrain the encoding's column (every task, seeds 0-5)
and replace its records: the README says how (`results/reference`); then write the other
CPUs' rows again on such a CPU: ``python tests/harness/test_records_are_todays_code.py``.
Until then a CPU's entry names the sentinels it has no rows of (``not_written``, with why), and
those are skipped there, visibly, rather than compared with rows of the old record.

Machines of one CPU model can round a sentinel differently too (stop 68: one code, two machines
of family 25 model 17, two first-epoch losses of string-cayley on wsj; the cause, perhaps what a
virtual machine reports to MKL, was not found): a sentinel's ``also`` lists the other rows that
model was measured to give, each at code that gave the model's written rows elsewhere, with where
it was seen; the first epoch must equal the written rows or one of those, bit for bit.
``__main__`` rewrites an entry without them: the rows of new code are measured anew on each
machine."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
import torch

from pe_bench.harness.grid import reproduce, store
from pe_bench.harness.grid.progress import METRICS_FILE

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference"
#: per CPU model of ``OTHER_ARITHMETIC_CPUS``: the sentinels' first-epoch metrics.csv rows (less
#: the wall time) as that CPU computes them, written by this file's ``__main__``. Family 6 model
#: 207's were written at defcc50 (stop 53) and are the rows of 09b3ea5 (stop 52, whose CI passed
#: these sentinels against the records on another machine) in every column: trained at both there.
OTHER_CPU_ROWS = Path(__file__).with_name("records_on_other_cpus.json")

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
#: Family 6 model 167 (stop 63, 2026-12-02; an "Intel Xeon Processor" with AVX512, the machine
#: CI then ran on): 5 sentinels identical to the records, 11 differ, at b5c406e (stop 61's HEAD,
#: whose CI had passed), e.g. abspos's first train loss 2.1151163578 (record) against 2.1151168346.
#: Family 25 model 17 (stop 64, 2026-12-02; an AMD EPYC with AVX512, the machine CI then ran on):
#: 15 sentinels identical to the records, string-cayley on wsj differs, at HEAD and at b5c406e
#: alike (train loss 2.9102063179 in the record against 2.9100871086, val WER 1.0019 against 1.0038).
#: Its rows were written again at 073dbc0 (stop 65) on a machine where that sentinel gave 2.9101097584;
#: at stop 68 a clean clone of 073dbc0 gave 2.9100871086 again on another machine of this model, as
#: did HEAD: one code, two roundings, so that sentinel lists the second under ``also``.
#: Family 6 model 106 (stop 67, 2026-12-03; an "Intel Xeon Processor @ 2.80GHz" with AVX512, the
#: machine CI then ran on): a clean clone of 2c3b7a9 (stop 66's HEAD, whose sentinels had passed on
#: family 25 model 17) failed 11 sentinels here and passed every other test (1698); its rows equal
#: family 6 model 167's in the 15 sentinels both have, but string-cayley on wsj (train loss
#: 2.9100644588 here, 2.9102065563 there), so the two CPU models are kept apart.
#: Family 26 model 2 (stop 69, 2026-12-04; "AMD EPYC", the machine CI then ran on): a clean clone
#: of HEAD and a checkout of edb579f (stop 68's HEAD, whose suite passed on family 25 model 17) both
#: failed string-cayley on wsj alone (train loss 2.9100646973 against the record's 2.9102063179, val
#: WER 1.0038 against 1.0019); the other 15 sentinels are identical to the records. Rows at edb579f.
OTHER_ARITHMETIC_CPUS = {
    "family 6 model 207",
    "family 6 model 167",
    "family 25 model 17",
    "family 6 model 106",
    "family 26 model 2",
}


def _other_arithmetic() -> str | None:
    """Why this machine's bits cannot be the records', or None."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != RECORDS_CPU or not torch.__version__.startswith(RECORDS_TORCH):
        return f"this is torch {torch.__version__} on {capability}"
    if store.cpu_model() in OTHER_ARITHMETIC_CPUS:
        return f"this CPU ({store.cpu_model()}) rounds differently with them"
    return None


def _rows_of_this_cpu() -> dict | None:
    """This CPU's entry of ``OTHER_CPU_ROWS`` where its torch and kernels are the records' but it
    rounds differently, else None."""
    if not OTHER_CPU_ROWS.is_file() or store.cpu_model() not in OTHER_ARITHMETIC_CPUS:
        return None
    entry = json.loads(OTHER_CPU_ROWS.read_text()).get(store.cpu_model())
    if entry is None or entry["torch"] != torch.__version__.split("+")[0]:
        return None
    return entry if entry["capability"] == torch.backends.cpu.get_cpu_capability() else None


comparable = pytest.mark.skipif(
    _other_arithmetic() is not None and _rows_of_this_cpu() is None,
    reason=f"the records' bits are those of torch {RECORDS_TORCH} on {RECORDS_CPU} CPU kernels of the records' "
    f"machine; {_other_arithmetic()}, and {OTHER_CPU_ROWS.name} has no rows of it (`pe-bench reproduce` compares "
    "anyway)",
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


def test_the_other_cpus_rows_are_of_todays_sentinels() -> None:
    """Rows of a CPU that is not denylisted would never be read, and rows of another cell or an
    older record would be compared with the wrong training."""
    cells = seed0_cells()
    for cpu, entry in json.loads(OTHER_CPU_ROWS.read_text()).items():
        assert cpu in OTHER_ARITHMETIC_CPUS, f"{OTHER_CPU_ROWS.name} has rows of {cpu}, not in OTHER_ARITHMETIC_CPUS"
        not_written = entry.get("not_written", {})
        assert set(entry["sentinels"]) | set(not_written) == set(SENTINEL_TASK), (
            f"{cpu}: write its rows again (__main__)"
        )
        assert not set(entry["sentinels"]) & set(not_written), f"{cpu}: a sentinel both written and not"
        assert all(why.strip() for why in not_written.values()), f"{cpu}: say why a sentinel's rows are not written"
        for method, sentinel in entry["sentinels"].items():
            cell = cells[SENTINEL_TASK[method], method]
            assert sentinel["cell"] == str(cell.relative_to(ROOT)), f"{cpu} · {method}: rows of another cell"
            stored = reproduce.read_metrics(cell / METRICS_FILE)[0]
            compared = set(stored) - set(reproduce.NOT_COMPARED)
            for rows in [sentinel["rows"]] + [other["rows"] for other in sentinel.get("also", [])]:
                assert len(rows) == 1 and rows[0]["epoch"] in ("0", "1"), rows
                assert set(rows[0]) == compared, f"{cpu} · {method}: other columns than the record's"
            for other in sentinel.get("also", []):
                assert other["rows"] != sentinel["rows"] and other["seen"].strip(), f"{cpu} · {method}: {other}"


@pytest.mark.slow
@comparable
@pytest.mark.parametrize("method", sorted(SENTINEL_TASK))
def test_a_shipped_record_is_what_todays_code_trains(method: str) -> None:
    cell = seed0_cells()[SENTINEL_TASK[method], method]
    other_cpu = _rows_of_this_cpu() if _other_arithmetic() is not None else None
    if other_cpu and method in other_cpu.get("not_written", {}):
        pytest.skip(
            f"{OTHER_CPU_ROWS.name} has no rows of this CPU ({store.cpu_model()}) for {method}'s record: "
            f"{other_cpu['not_written'][method]}; write them here (`python {Path(__file__).relative_to(ROOT)}`)"
        )
    expected = other_cpu["sentinels"][method]["rows"] if other_cpu else None
    result = reproduce.reproduce_cell(cell, epochs=1, expected_rows=expected)
    assert not result.skipped, result.skipped
    also = other_cpu["sentinels"][method].get("also", []) if other_cpu else []
    if not result.identical and any(not reproduce.compare_rows(o["rows"], result.rows, 1)[1] for o in also):
        return  # this machine gives another rounding its CPU model is known to give (see the docstring)
    against = (
        f"the rows this CPU made of it at {other_cpu['code']} ({OTHER_CPU_ROWS.name}: the record's training as "
        "this CPU rounds it)"
        if other_cpu
        else "the record"
    )
    if also:
        against += f" and its {len(also)} other known rounding(s)"
    assert result.identical, (
        f"{result.label}: today's code no longer trains the shipped record {cell.relative_to(ROOT)}, compared with "
        f"{against} ({'; '.join(result.differences)}). If the change is meant, retrain the {method} column (every "
        "task, seeds 0-5) into a new results/reference folder and remove its old records; if not, it is a regression."
        + ("" if other_cpu else _unknown_cpu_hint())
    )


def _unknown_cpu_hint() -> str:
    """What to check when a sentinel differs from a record on a CPU not known to round differently:
    stop 53 met a CPU whose kernels differ from the records' at the same torch and instruction set."""
    return (
        f" Unless this CPU ({store.cpu_model()}) is the cause: if a commit whose suite passed these sentinels on "
        "another machine differs here too (`pe-bench reproduce results/reference/* --seeds 0 --methods nopos`), "
        "this CPU rounds differently: add it to OTHER_ARITHMETIC_CPUS and write its rows "
        "(`python tests/harness/test_records_are_todays_code.py`) with code that gives that commit's rows."
    )


def write_rows_of_this_cpu() -> None:
    """Train the sentinels' first epochs here and store their rows as this CPU's entry of
    ``OTHER_CPU_ROWS``. Only for a CPU of ``OTHER_ARITHMETIC_CPUS``, and only at code that
    reproduces the records bit for bit on the records' machine (CI passed the sentinels there)."""
    cpu = store.cpu_model()
    if cpu not in OTHER_ARITHMETIC_CPUS:
        raise SystemExit(f"this CPU ({cpu}) is not in OTHER_ARITHMETIC_CPUS: compare with the records themselves")
    reproduce.quiet_lightning()
    cells, sentinels = seed0_cells(), {}
    for method, task in sorted(SENTINEL_TASK.items()):
        result = reproduce.reproduce_cell(cells[task, method], epochs=1)
        assert not result.skipped and len(result.rows) == 1, (method, result.skipped, result.rows)
        print(f"{method} on {task}: {'identical to' if result.identical else 'differs from'} the record here")
        rows = [{k: v for k, v in row.items() if k not in reproduce.NOT_COMPARED} for row in result.rows]
        sentinels[method] = {"cell": str(cells[task, method].relative_to(ROOT)), "rows": rows}
    code = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    every_cpu = json.loads(OTHER_CPU_ROWS.read_text()) if OTHER_CPU_ROWS.is_file() else {}
    every_cpu[cpu] = {
        "code": code.stdout.strip() or "unknown",
        "written": date.today().isoformat(),
        "torch": torch.__version__.split("+")[0],
        "capability": torch.backends.cpu.get_cpu_capability(),
        "sentinels": sentinels,
    }
    OTHER_CPU_ROWS.write_text(json.dumps(every_cpu, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(sentinels)} sentinels' rows of {cpu} into {OTHER_CPU_ROWS}")


if __name__ == "__main__":
    sys.exit(write_rows_of_this_cpu())
