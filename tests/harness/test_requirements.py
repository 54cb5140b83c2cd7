"""The oldest torch pe-bench runs on: named at import when older, and the same in pyproject."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from pe_bench.requirements import MIN_TORCH, check_torch

REPO_ROOT = Path(__file__).resolve().parents[2]  # the repository


@pytest.mark.parametrize("version", ["2.10.0+cu128", "2.4.1", "1.13.1+cpu", "2.10.0a0+git1234"])
def test_an_older_torch_is_an_import_error_naming_it_and_the_fix(version):
    with pytest.raises(ImportError) as error:
        check_torch(version)
    message = str(error.value)
    assert f"torch {version}" in message and "pip install 'torch>=2.11' 'torchvision>=0.26'" in message


@pytest.mark.parametrize("version", ["2.11.0+cu130", "2.14.1", "2.15.0.dev20270101+cpu", "3.0.0", "unknown"])
def test_supported_and_unparsable_releases_pass(version):
    check_torch(version)


def test_pyproject_declares_the_same_oldest_torch_and_its_torchvision():
    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    needed = ".".join(map(str, MIN_TORCH))
    assert f"torch>={needed}" in dependencies
    assert f"torchvision>=0.{MIN_TORCH[1] + 15}" in dependencies  # torchvision 0.X pairs with torch 2.(X - 15)
