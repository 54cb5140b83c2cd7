"""The README's "Adding an encoding" example, exercised end to end through the entry point."""

from __future__ import annotations

import re
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from pe_bench.adapters import registry
from pe_bench.harness.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugin"


@pytest.fixture
def installed_plugin(monkeypatch):
    """As if `pip install examples/plugin` had run: the entry point is visible to the registry."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    entry = EntryPoint(name="gaussian-bias", value="pe_bench_gaussian:GaussianBias", group=registry.ENTRY_POINT_GROUP)

    def fake_entry_points(group=None):
        return [entry] if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    yield
    registry._REGISTRY.pop("gaussian-bias", None)
    sys.modules.pop("pe_bench_gaussian", None)


def test_readme_shows_the_example_files_verbatim():
    readme = (ROOT / "README.md").read_text()
    for path in (EXAMPLE / "pe_bench_gaussian" / "__init__.py", EXAMPLE / "pyproject.toml"):
        assert path.read_text().strip() in readme, f"README's copy of {path.name} is out of date"


def test_plugin_is_discovered_checked_and_runs_in_a_grid(installed_plugin, tmp_path, capsys):
    assert "gaussian-bias" in registry.available()
    assert main(["check", "gaussian-bias"]) == 0
    assert re.search(r"PASS|passed", capsys.readouterr().out, re.IGNORECASE)
    code = main([
        "run", "--tasks", "imagenet", "--methods", "gaussian-bias", "--out", str(tmp_path),
        "--set", "optim.epochs=1", "--set", "data.train_size=64", "--set", "data.val_size=32",
        "--set", "data.test_size=32", "--set", "model.dim=32", "--set", "model.depth=1",
    ])  # fmt: skip
    assert code == 0
    assert "gaussian-bias" in (tmp_path / "table.md").read_text()
