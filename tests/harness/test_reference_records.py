"""The README's matrix must be backed by records: the records shipped in ``results/reference``
are rendered into one matrix and compared with the README, cell by cell."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pe_bench.harness.cli import main

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference"
FOLDERS = sorted(p.name for p in REFERENCE.iterdir() if (p / "runs").is_dir())


def _copy(folder: str, tmp_path: Path) -> Path:
    """A scratch copy: `pe-bench table` writes its table files into the folder it reads."""
    out = tmp_path / folder
    shutil.copytree(REFERENCE / folder, out)
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _rows(markdown: str, column: str) -> dict[str, dict[str, str]]:
    """method -> {column: cell} (emphasis kept) of the first "Position encoding" table that has
    ``column``, whatever the padding of its header."""
    lines = markdown.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| Position encoding") and column in _cells(line))
    header = _cells(lines[start])
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_readme_matrix_is_the_merged_table_of_the_shipped_records(capsys):
    """Every cell of the README's matrix, its emphasis and its Average column, is what
    `pe-bench table` prints from the shipped folders together (it writes nothing when merging),
    and the matrix has no row or column the records do not hold."""
    argv = ["table"] + [arg for folder in FOLDERS for arg in ("--out", str(REFERENCE / folder))]
    files = sorted(REFERENCE.rglob("*"))
    assert main(argv) == 0
    assert sorted(REFERENCE.rglob("*")) == files, "merging must not write into the reference folders"
    fresh = _rows(capsys.readouterr().out, "Position encoding")
    readme = _rows((ROOT / "README.md").read_text(), "coco mAP")
    assert sorted(readme) == sorted(fresh), "the README matrix and the records hold other encodings"
    for method, cells in fresh.items():
        assert list(readme[method]) == list(cells), f"README matrix columns differ from the records' ({method})"
        for column, cell in cells.items():
            assert readme[method][column] == cell, (
                f"README matrix, {method} · {column}: {readme[method][column]!r}, but the shipped "
                f"records (`pe-bench table` with --out {' --out '.join(FOLDERS)}) give {cell!r}"
            )
    assert re.search(r"\d", "".join(c for cells in fresh.values() for c in cells.values()))


def _dry_run(out: Path, capsys, *extra: str) -> str:
    tasks = ",".join(sorted(p.name for p in (out / "runs").iterdir() if p.is_dir()))
    # --jobs 2 pins one thread per cell, as every shipped column was trained.
    argv = ["run", "--tasks", tasks, "--methods", "all", "--seeds", "0,1,2", "--profile", "tiny"]
    main([*argv, "--out", str(out), "--jobs", "2", "--dry-run", "--no-progress", *extra])
    return capsys.readouterr().out


@pytest.mark.parametrize("folder", FOLDERS)
def test_shipped_records_are_of_the_current_tiny_profiles(folder, tmp_path, capsys):
    """A README number from a profile that has since changed would look right and be wrong: every
    shipped cell must be one that `pe-bench run` would reuse under today's YAML."""
    out = _copy(folder, tmp_path)
    cells = len(list((out / "runs").glob("*/*/seed*/result.json")))
    plan = _dry_run(out, capsys)
    assert f"would do: {cells} reuse\n" in plan, plan[-2000:]
    # The check can fail: a changed schedule makes every trained cell a conflict.
    trained = len(list((out / "runs").glob("*/*/seed*/config.yaml")))
    changed = _dry_run(out, capsys, "--set", "optim.epochs=999")
    assert re.search(rf"would do: .*\b{trained} conflict\n", changed), changed[-2000:]
