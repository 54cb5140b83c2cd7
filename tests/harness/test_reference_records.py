"""The README's matrices must be backed by records: the records shipped in ``results/reference``
are rendered as the README says and compared with it, cell by cell. The main matrix merges the
folders of seeds 0-2 (what `pe-bench run ... --seeds 0,1,2` gives); the 6-seed matrix adds the
folders of seeds 3-5 for the columns they complete."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pe_bench.harness.cli import main

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference"
FOLDERS = sorted(p.name for p in REFERENCE.iterdir() if (p / "runs").is_dir())


def _seeds(folder: Path) -> list[int]:
    return sorted({int(p.name.removeprefix("seed")) for p in folder.glob("runs/*/*/seed*")})


MATRIX_FOLDERS = [f for f in FOLDERS if _seeds(REFERENCE / f) == [0, 1, 2]]
MORE_SEEDS = [f for f in FOLDERS if f not in MATRIX_FOLDERS]


def _copy(folder: str, tmp_path: Path) -> Path:
    """A scratch copy: `pe-bench table` writes its table files into the folder it reads."""
    out = tmp_path / folder
    shutil.copytree(REFERENCE / folder, out)
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _rows(markdown: str, columns: list[str] | None = None, section: str | None = None) -> dict[str, dict[str, str]]:
    """method -> {column: cell} (emphasis kept) of the first "Position encoding" table, or of the
    first whose header is exactly ``columns``, whatever the padding of its header; with
    ``section``, the first such table after that heading line (both matrices have every column)."""
    lines = markdown.split("\n")
    first = lines.index(section) if section is not None else 0
    start = next(
        i
        for i, line in enumerate(lines)
        if i >= first and line.startswith("| Position encoding") and (columns is None or _cells(line) == columns)
    )
    header = _cells(lines[start])
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def _more_seeds_tasks() -> list[str]:
    return sorted({p.name for folder in MORE_SEEDS for p in (REFERENCE / folder / "runs").iterdir() if p.is_dir()})


def _check_readme_table(
    folders: list[str], capsys, *extra: str, section: str | None = None
) -> dict[str, dict[str, str]]:
    """The README table with the header `pe-bench table --out F1 --out F2 ... EXTRA` prints (the
    first after the heading ``section``, if given) must hold exactly its rows and cells (emphasis
    and Average included)."""
    argv = ["table"] + [arg for folder in folders for arg in ("--out", str(REFERENCE / folder))] + list(extra)
    files = sorted(REFERENCE.rglob("*"))
    assert main(argv) == 0
    assert sorted(REFERENCE.rglob("*")) == files, "merging must not write into the reference folders"
    fresh = _rows(capsys.readouterr().out)
    header = list(next(iter(fresh.values())))  # the first column is "Position encoding"
    readme = _rows((ROOT / "README.md").read_text(), header, section)
    assert sorted(readme) == sorted(fresh), "the README matrix and the records hold other encodings"
    for method, cells in fresh.items():
        for column, cell in cells.items():
            assert readme[method][column] == cell, (
                f"README matrix, {method} · {column}: {readme[method][column]!r}, but the shipped "
                f"records (`pe-bench {' '.join(argv)}`) give {cell!r}"
            )
    assert re.search(r"\d", "".join(c for cells in fresh.values() for c in cells.values()))
    return fresh


def test_readme_matrix_is_the_merged_table_of_the_shipped_records(capsys):
    """Every cell of the README's matrix is what `pe-bench table` prints from the shipped
    folders of seeds 0-2 together (it writes nothing when merging)."""
    fresh = _check_readme_table(MATRIX_FOLDERS, capsys)
    assert "coco mAP" in next(iter(fresh.values()))


@pytest.mark.skipif(not MORE_SEEDS, reason="no folder of further seeds is shipped")
def test_readme_six_seed_matrix_is_the_merged_table_of_the_shipped_records(capsys):
    """The 6-seed matrix: every folder merged, the columns that the further seeds complete.
    Every cell of those columns must hold 6 seeds, or the matrix would compare 3 with 6."""
    tasks = _more_seeds_tasks()
    fresh = _check_readme_table(FOLDERS, capsys, "--tasks", ",".join(tasks), section="### Six seeds")
    skip = ("Position encoding", "Average")
    cells = [cell for row in fresh.values() for column, cell in row.items() if column not in skip]
    assert cells and not any("/6)" in cell for cell in cells), "a column of the 6-seed matrix lacks seeds"


def _dry_run(out: Path, capsys, *extra: str) -> str:
    tasks = ",".join(sorted(p.name for p in (out / "runs").iterdir() if p.is_dir()))
    # the encodings the folder holds (a folder may re-run one encoding's cells, stop 43's pape)
    methods = ",".join(sorted({p.name for p in (out / "runs").glob("*/*") if p.is_dir()}))
    seeds = ",".join(map(str, _seeds(out)))
    # --jobs 2 pins one thread per cell, as every shipped column was trained.
    argv = ["run", "--tasks", tasks, "--methods", methods, "--seeds", seeds, "--profile", "tiny"]
    main([*argv, "--out", str(out), "--jobs", "2", "--dry-run", "--no-progress", *extra])
    return capsys.readouterr().out


@pytest.mark.parametrize("folder", FOLDERS)
def test_shipped_records_are_of_the_current_tiny_profiles(folder, tmp_path, capsys):
    """A README number from a profile that has since changed would look right and be wrong: every
    shipped cell must be one that `pe-bench run` would reuse under today's YAML."""
    out = _copy(folder, tmp_path)
    cells = len(list((out / "runs").glob("*/*/seed*/result.json")))
    plan = _dry_run(out, capsys)
    # A folder may hold some cells of its grid (a retrained cell's old record is removed from
    # its folder, stop 44): the rest would train; what matters is that every stored cell is reused.
    summary = re.search(r"would do: (.*)\n", plan)
    assert summary and f"{cells} reuse" in summary.group(1).split(", "), plan[-2000:]
    assert not re.search(r"conflict|retry", summary.group(1)), plan[-2000:]
    # The check can fail: a changed schedule makes every trained cell a conflict.
    trained = len(list((out / "runs").glob("*/*/seed*/config.yaml")))
    changed = _dry_run(out, capsys, "--set", "optim.epochs=999")
    assert re.search(rf"would do: .*\b{trained} conflict\n", changed), changed[-2000:]


def test_readme_has_each_section_once():
    """A section pasted twice keeps the old copy's text beside the new one (stop 65 left the
    translation section twice: one copy said the fixed corpus defect was open, the other held
    imagenet's table under translation's heading)."""
    headings, fenced = [], False
    for line in (ROOT / "README.md").read_text(encoding="utf-8").split("\n"):
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            headings.append(line)
    assert [h for h in set(headings) if headings.count(h) > 1] == []
    assert len(headings) > 30
