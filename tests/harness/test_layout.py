"""The installed import paths and the folders agree (pyproject maps top-level folders)."""

from pathlib import Path

import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]  # the repository

MAPPED = {folder: f"pe_bench.{folder}" for folder in ("harness", "adapters", "tasks", "configs")}


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = set()
    for folder, package in MAPPED.items():
        for init in (REPO_ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO_ROOT / folder).parts
            on_disk.add(".".join((package, *relative)))
    assert on_disk - listed == set(), "add these packages to [tool.setuptools] packages"
    assert listed - on_disk - {"pe_bench"} == set(), "pyproject lists packages that have no folder"


def test_task_families_do_not_import_each_other():
    families = [p.name for p in (REPO_ROOT / "tasks").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))]
    for family in families:
        for source in (REPO_ROOT / "tasks" / family).rglob("*.py"):
            text = source.read_text()
            for other in families:
                if other != family:
                    assert f"pe_bench.tasks.{other}" not in text, f"{source} imports the {other} family"


def test_the_kit_does_not_import_the_application():
    for name in ("attention.py", "blocks.py", "config.py", "data.py", "module.py"):
        text = (REPO_ROOT / "harness" / name).read_text()
        for application in ("grid", "reports", "cli", "conformance"):
            assert f"pe_bench.harness.{application}" not in text, f"harness/{name} imports {application}"


def test_tasks_do_not_import_the_application():
    for source in (REPO_ROOT / "tasks").rglob("*.py"):
        text = source.read_text()
        for application in ("grid", "reports", "cli", "conformance"):
            assert f"pe_bench.harness.{application}" not in text, f"{source} imports harness/{application}"
