"""Resolution extrapolation: interpolation scale, table layout, and the command end to end."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config, parse_overrides
from pe_bench.harness.grid import store
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.grid.runner import resolved_config
from pe_bench.harness.reports import extrapolate as ex

REPO_ROOT = Path(__file__).resolve().parents[2]  # the repository

SMALL = [
    "--set", "optim.epochs=1", "--set", "data.train_size=64", "--set", "data.val_size=32",
    "--set", "data.test_size=32", "--set", "model.dim=32", "--set", "model.depth=1",
]  # fmt: skip


def test_resolutions_and_interpolation_scale():
    assert ex.parse_resolutions("24, 48,96x48") == [(24, 24), (48, 48), (96, 48)]
    assert ex.default_resolutions(24, 4, "tiny") == [(24, 24), (36, 36), (48, 48), (72, 72), (96, 96)]
    assert ex.default_resolutions(224, 16, "paper")[-1] == (1024, 1024)
    assert ex.interpolation_scale((224, 224), (448, 896)).tolist() == [0.5, 0.25]


def _frame(rows):
    return pd.DataFrame(rows, columns=["method", "seed", "resolution", "pixels", "interpolation", "accuracy"])


def test_tables_5_6_7_layout():
    rows = []
    for method, plain, interp in (("sincos", (80, 40), (80, 70)), ("pape", (81, 75), (81, 60))):
        for (res, pixels), p, i in zip((("224²", 1), ("448²", 4)), plain, interp, strict=True):
            rows += [(method, 0, res, pixels, False, p), (method, 0, res, pixels, True, i)]
    rows += [("abspos", 0, "224²", 1, False, 79.0), ("abspos", 0, "224²", 1, True, None)]
    rows += [("abspos", 0, "448²", 4, False, 30.0), ("abspos", 0, "448²", 4, True, None)]
    tables = ex.extrapolation_tables(_frame(rows))
    assert "**75.0**" in tables["table5"] and "<u>40.0</u>" in tables["table5"]
    assert "70.0 (+30.0)" in tables["table6"] and "60.0 (-15.0)" in tables["table6"]
    assert "n/a" in tables["table6"]
    table7 = tables["table7"]
    assert "sincos (with interpolation)" in table7 and "pape (without interpolation)" in table7
    assert "abspos (without interpolation)" in table7
    assert table7.index("224²") < table7.index("448²")  # resolutions in increasing order


@pytest.mark.slow
def test_extrapolate_command_end_to_end(tmp_path, capsys):
    assert main(["run", "--tasks", "imagenet", "--methods", "rope,abspos,nopos", "--out", str(tmp_path), *SMALL]) == 0
    without = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    (without / "best.ckpt").unlink()
    capsys.readouterr()
    code = main(["extrapolate", "--task", "imagenet", "--resolutions", "24,48x24", "--out", str(tmp_path)])
    assert code == 0
    # a finished cell without its checkpoint is named, on the console and under the tables
    assert f"left out, no usable checkpoint: nopos seed 0: no best.ckpt in {without}" in capsys.readouterr().out
    target = tmp_path / "extrapolation" / "imagenet"
    for name in ("results.csv", "table5.md", "table6.md", "table7.md", "figure.png", "figure.pdf"):
        assert (target / name).is_file(), name
    frame = pd.read_csv(target / "results.csv")
    assert frame[(frame.method == "abspos") & frame.interpolation]["accuracy"].isna().all()
    rope = frame[(frame.method == "rope") & (frame.resolution == "24²")].set_index("interpolation")["accuracy"]
    assert rope[True] == rope[False]  # at the training resolution the scale is 1: nothing changes
    # the 1x column is the cell's own test set: the score the grid recorded for it
    for method in ("rope", "abspos"):
        record = store.read_record(store.cell_dir(tmp_path, "imagenet", method, 0))
        at_1x = frame[(frame.method == method) & (frame.resolution == "24²") & ~frame.interpolation]["accuracy"]
        assert at_1x.item() == pytest.approx(record.score, abs=1e-9)
    assert "48×24" in (target / "table5.md").read_text()  # non-square evaluation works
    assert "nopos" not in set(frame.method)
    for name in ("table5.md", "table6.md", "table7.md"):
        assert f"no usable checkpoint):\n- nopos seed 0: no best.ckpt in {without}" in (target / name).read_text()


class RunsCode:
    """Unpickling this runs a shell command: what a planted checkpoint could do."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_checkpoint_that_would_run_code_is_refused_naming_the_file(tmp_path, capsys):
    config = load_run_config("imagenet", "tiny", parse_overrides(["model.dim=32", "model.depth=1"]))
    method = parse_method("rope")
    cell = store.cell_dir(tmp_path, "imagenet", "rope", 0)
    cell.mkdir(parents=True)
    (cell / "config.yaml").write_text(yaml.safe_dump(resolved_config(config, method, {})))
    marker = tmp_path / "code-ran"
    torch.save({"state_dict": {}, "payload": RunsCode(f"touch {marker}")}, cell / "best.ckpt")
    with pytest.raises(ValueError, match="refused to load it") as refused:
        ex.load_cell(cell, None)
    assert str(cell / "best.ckpt") in str(refused.value) and "posix.system" in str(refused.value)
    assert main(["analyze", "--task", "imagenet", "--method", "rope", "--out", str(tmp_path)]) == 2
    assert f"error: {cell / 'best.ckpt'} is not a plain weights checkpoint" in capsys.readouterr().err
    assert not marker.exists()


def test_no_checkpoint_is_loaded_with_weights_only_false():
    folders = ("adapters", "harness", "tasks", "pe_bench", "examples", "tests")
    sources = [p for folder in folders for p in (REPO_ROOT / folder).rglob("*.py") if p != Path(__file__)]
    unsafe = [str(p) for p in sources if re.search(r"weights_only\s*=\s*False", p.read_text())]
    assert sources and unsafe == []


@pytest.mark.parametrize("name", ["cape", "wepe", "sape2", "cope", "abspos"])
def test_encodings_that_map_or_index_the_grid_themselves_have_no_interpolated_column(name):
    """CAPE maps each grid to [-1, 1] and WePE divides by the current grid (their own
    interpolation), SaPE² rounds positions to cell indices and CoPE reads their order, abspos
    resizes its table: positions scaled by train/test on top measured a double scaling (until
    stop 61 the README's table showed wepe 67.2 -> 18.5 at 96² for it), so Table 6 shows n/a."""
    from pe_bench.adapters import get

    assert not get(name).supports_position_interpolation
