"""The README's operator counts ("Operators per pass") recomputed from the code: ViT-B/16's
counts come out the same for a narrow 12-layer ViT (operators do not depend on widths or
the grid size), so every row is checked in about a second, with the per-forward memo off
and on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from pe_bench.adapters import EncodingFactory, PositionLayout
from pe_bench.harness.config import ModelConfig
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.reports.op_count import operators_per_pass
from pe_bench.tasks._shared.vit import ViT, image_geometry

README = Path(__file__).resolve().parents[2] / "README.md"
# ViT-B's depth and patch; narrow and on a 4 x 4 grid (the counts are those of ViT-B/16 224²).
NARROW_VIT_B = ModelConfig(dim=64, depth=12, num_heads=4, patch_size=16)


def _readme_rows() -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """encoding -> ((ops_fwd off, on), (ops_train off, on)) from the README's table."""
    text = README.read_text()
    table = text[text.index("| encoding | ops_fwd off → on |") :].split("\n\n")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = cells[0].replace(" (m = 50)", "")

        def pair(cell: str) -> tuple[int, int]:
            values = [int(v) for v in re.findall(r"\d+", cell)]
            return (values[0], values[-1])

        rows[name] = (pair(cells[1]), pair(cells[2]))
    return rows


ROWS = _readme_rows()


def _counts(method: str) -> tuple[int, int]:
    torch.manual_seed(0)
    model = ViT(EncodingFactory(method, {}), image_geometry((64, 64), 16), NARROW_VIT_B, 3, 1000)
    return operators_per_pass(model, torch.randn(1, 3, 64, 64))


def test_the_table_lists_the_encodings_the_memo_serves():
    assert {"nopos", "rope", "pape", "alibi", "lookhere", "relpos"} <= ROWS.keys()


@pytest.mark.parametrize("method", sorted(ROWS))
def test_readme_counts_are_the_codes(method, monkeypatch):
    (fwd_off, fwd_on), (train_off, train_on) = ROWS[method]
    assert _counts(method) == (fwd_on, train_on)
    monkeypatch.setattr(PositionLayout, "sharing_features", lambda self: self)
    assert _counts(method) == (fwd_off, train_off)


def _position_space_rows() -> dict[str, tuple[int, int, int, str]]:
    """method spec -> (ops_fwd, ops_train, ops_train bf16, FLOP bound) from the README's table
    of PaPE in projected and position space (Benchmark, "PaPE in position space")."""
    text = README.read_text()
    table = text[text.index("| method | ops_fwd | ops_train | ops_train bf16 |") :].split("\n\n")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        spec = cells[0]
        if ", " in spec:  # "pape[m=8], position": the space as an option
            base, space = spec.split(", ")
            spec = parse_method(base).with_options(space=space.split()[0]).label
        rows[spec] = (int(cells[1]), int(cells[2]), int(cells[3]), cells[6])
    return rows


POSITION_SPACE_ROWS = _position_space_rows()


@pytest.mark.parametrize("spec", sorted(POSITION_SPACE_ROWS))
def test_readme_position_space_counts_are_the_codes(spec):
    from pe_bench.harness.reports.bench import MODELS
    from pe_bench.harness.reports.throughput import flop_bound

    fwd, train, train_bf16, bound = POSITION_SPACE_ROWS[spec]
    parsed = parse_method(spec)
    torch.manual_seed(0)
    model = ViT(EncodingFactory(parsed.name, dict(parsed.options)), image_geometry((64, 64), 16), NARROW_VIT_B, 3, 1000)
    images = torch.randn(1, 3, 64, 64)
    assert operators_per_pass(model, images) == (fwd, train)
    assert operators_per_pass(model, images, torch.bfloat16)[1] == train_bf16
    assert f"{flop_bound(spec, MODELS['vit-b'][0], 224):.3f}" == bound


def test_the_position_space_table_has_both_spaces_of_each_pape_row():
    specs = set(POSITION_SPACE_ROWS)
    assert {"nopos", "pape[space=projected]", "pape[space=position]"} <= specs
    assert sum("space=position" in s for s in specs) == sum("space=projected" in s for s in specs) == 4
