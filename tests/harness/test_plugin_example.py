"""The README's "Adding an encoding" example, exercised end to end through the entry point."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository

EXAMPLE = ROOT / "examples" / "plugin"


def pip_install_into(target: Path, project: Path) -> None:
    """A real ``pip install`` of a plug-in project into ``target`` (its dist-info carries the
    entry points, exactly as in a user's environment). pip builds in the project's folder
    (build/, *.egg-info), so it builds a copy: two test workers (pytest-xdist) installing
    the same example at once would otherwise share those folders."""
    with tempfile.TemporaryDirectory(prefix="plugin-build-") as scratch:
        copy = shutil.copytree(project, Path(scratch) / project.name)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
             str(target), str(copy)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip


def pe_bench(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter that sees the packages installed into ``site``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pe_bench.harness.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    pip_install_into(site, EXAMPLE)
    return site


def test_readme_shows_the_example_files_verbatim():
    readme = (ROOT / "README.md").read_text()
    for path in (EXAMPLE / "pe_bench_gaussian" / "__init__.py", EXAMPLE / "pyproject.toml"):
        assert path.read_text().strip() in readme, f"README's copy of {path.name} is out of date"


def test_installed_plugin_is_discovered_checked_and_runs_in_a_grid(installed_plugin, tmp_path):
    listed = pe_bench(installed_plugin, "list", "methods", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"gaussian-bias .*plug-in pe-bench-gaussian 0\.1\.0", listed.stdout), listed.stdout
    checked = pe_bench(installed_plugin, "check", "gaussian-bias", cwd=tmp_path)
    assert checked.returncode == 0 and re.search(r"PASS|passed", checked.stdout, re.IGNORECASE), checked.stdout
    ran = pe_bench(
        installed_plugin, "run", "--tasks", "imagenet", "--methods", "gaussian-bias", "--out", str(tmp_path / "out"),
        "--set", "optim.epochs=1", "--set", "data.train_size=64", "--set", "data.val_size=32",
        "--set", "data.test_size=32", "--set", "model.dim=32", "--set", "model.depth=1", cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "gaussian-bias" in (tmp_path / "out" / "table.md").read_text()


def write_plugin(root: Path, name: str, entry: str, module: str) -> Path:
    (root / "plug").mkdir(parents=True)
    (root / "plug" / "__init__.py").write_text(module)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "1.0"\n'
        f'[project.entry-points."pe_bench.encodings"]\n{entry}\n'
    )
    return root


def test_a_broken_plugin_is_reported_and_breaks_no_unrelated_command(tmp_path):
    site = tmp_path / "site"
    broken = "raise ImportError('no such dependency: foo')\n"
    pip_install_into(site, write_plugin(tmp_path / "broken", "broken-plugin", 'broken = "plug:Missing"', broken))
    listed = pe_bench(site, "list", "methods", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "rope" in listed.stdout and "broken" not in listed.stdout.split("plug-ins that failed")[0]
    said = listed.stderr + listed.stdout
    assert "broken-plugin" in said and "no such dependency: foo" in said


def test_a_plugin_named_like_a_builtin_is_ignored_with_a_warning(tmp_path):
    module = "from pe_bench.adapters.nopos import NoPosition as Impostor\n"
    site = tmp_path / "site"
    pip_install_into(site, write_plugin(tmp_path / "clash", "clash-plugin", 'rope = "plug:Impostor"', module))
    listed = pe_bench(site, "list", "methods", "-v", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "clash-plugin" in listed.stderr and "built-in name" in listed.stderr
    assert re.search(r"^rope .*pe_bench\.adapters\.rope", listed.stdout, re.MULTILINE), listed.stdout


TASK_EXAMPLE = ROOT / "examples" / "task_plugin"


def test_readme_shows_the_task_example_verbatim():
    readme = (ROOT / "README.md").read_text()
    for path in (TASK_EXAMPLE / "pe_bench_marker" / "__init__.py", TASK_EXAMPLE / "pyproject.toml"):
        assert path.read_text().strip() in readme, f"README's copy of {path.name} is out of date"


def test_installed_task_plugin_is_listed_and_runs_in_a_grid(tmp_path):
    site = tmp_path / "site"
    pip_install_into(site, TASK_EXAMPLE)
    listed = pe_bench(site, "list", "tasks", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"marker-direction .*plug-in pe-bench-marker 0\.1\.0", listed.stdout), listed.stdout
    out = str(tmp_path / "out")
    ran = pe_bench(site, "run", "--tasks", "marker-direction", "--methods", "nopos,rope", "--out", out, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    table = (tmp_path / "out" / "table.md").read_text()
    assert "marker-direction Acc. (%)" in table and "rope" in table and "nopos" in table
