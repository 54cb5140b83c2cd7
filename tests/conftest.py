"""Shared test settings: where the repository is."""

from pathlib import Path

#: the repository root (README.md, examples/, pyproject.toml)
REPO_ROOT = Path(__file__).resolve().parents[1]
