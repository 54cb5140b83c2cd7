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


def _rows(method, seed, accuracy, interpolated=None):
    """One cell's rows at 224² (plain, and interpolated: None where the encoding has none)."""
    return [(method, seed, "224²", 1, False, accuracy), (method, seed, "224²", 1, True, interpolated)]


def test_equal_printed_values_get_equal_marks():
    """50.15 prints as 50.1 (its binary value is 50.1499...), but pandas' round(1) made it 50.2:
    previously `pape **50.1**` stood beside `rope <u>50.1</u>`. Ranked by the printed text,
    equal text shares the mark and the next printed value is underlined, as in the matrix."""
    frame = _frame([*_rows("pape", 0, 50.15, 50.15), *_rows("rope", 0, 50.1, 50.1), *_rows("sincos", 0, 49.0, 49.0)])
    tables = ex.extrapolation_tables(frame)
    for name in ("table5", "table7"):
        assert tables[name].count("**50.1**") == 2 and "<u>50.1</u>" not in tables[name], tables[name]
        assert "<u>49.0</u>" in tables[name]
    assert tables["table6"].count("**50.1 (+0.0)**") == 2 and "<u>49.0 (+0.0)</u>" in tables["table6"]


def _config(method, lr=0.002):
    return {
        "task": "imagenet", "profile": "tiny", "model": {"dim": 32, "depth": 1, "num_heads": 4},
        "optim": {"lr": lr, "epochs": 2}, "data": {"image_size": 24}, "method": method,
        "encoding": method, "options": {},
    }  # fmt: skip


def _stored(out, method, seed, status="ok", checkpoint=True, lr=0.002):
    """A trained cell on disk as `pe-bench run` leaves it (an empty best.ckpt: never loaded here)."""
    directory = store.cell_dir(out, "imagenet", method, seed)
    record = store.CellRecord(
        task="imagenet", method=method, seed=seed, profile="tiny", status=status, metric="acc",
        metric_label="Acc. (%)", score=50.0 if status == "ok" else None,
    )  # fmt: skip
    store.write_record(directory, record)
    if status == "ok":
        (directory / "config.yaml").write_text(yaml.safe_dump(_config(method, lr)))
        if checkpoint:
            (directory / "best.ckpt").write_bytes(b"")


def test_cells_missing_seeds_or_of_another_configuration_are_marked_and_not_ranked(tmp_path):
    """pape holds 1 of 3 seeds (the others failed and diverged): previously its 75.0 was bold
    over rope's complete 70.0 with nothing showing it. As in the matrix: (held/asked), † for a
    seed trained otherwise, the missing seeds named with why, and neither ranked."""
    for seed in range(3):
        for method in ("rope", "abspos"):
            _stored(tmp_path, method, seed)
        _stored(tmp_path, "sincos", seed, lr=0.01 if seed == 2 else 0.002)
        _stored(tmp_path, "nopos", seed, checkpoint=seed != 2)
    _stored(tmp_path, "pape", 0)
    _stored(tmp_path, "pape", 1, status="failed")
    _stored(tmp_path, "pape", 2, status="diverged")
    cells = ex.finished_cells(tmp_path, "imagenet", None)
    accuracy = {"pape": 75.0, "sincos": 80.0, "rope": 70.0, "abspos": 60.0, "nopos": 90.0}
    frame = _frame([row for c in cells for row in _rows(c.method, c.seed, accuracy[c.method], accuracy[c.method])])
    frame.attrs.update(ex.seed_context(tmp_path, "imagenet", None, cells))
    tables = ex.extrapolation_tables(frame)
    for name in ("table5", "table7"):
        table = tables[name]
        assert "| 75.0 (1/3) " in table and "| 90.0 (2/3) " in table and "| 80.0 † " in table, table
        assert "**70.0**" in table and "<u>60.0</u>" in table
    assert "| 75.0 (+0.0) (1/3) " in tables["table6"] and "**70.0 (+0.0)**" in tables["table6"]
    notes = "\n".join(ex.extrapolation_notes(frame))
    assert "3 seed(s) asked for (0, 1, 2)" in notes
    assert "Missing seeds: " in notes and "pape seed 1 failed, seed 2 diverged" in notes
    assert "nopos seed 2 no usable checkpoint" in notes
    assert "† another configuration than the rest of its task (not ranked): sincos seed 2: optim.lr=0.01" in notes
    frame.attrs["left_out"] = ex.cells_without_checkpoint(tmp_path, "imagenet", None)
    ex.write_extrapolation(tmp_path, "imagenet", frame, "24²")
    written = (tmp_path / "extrapolation" / "imagenet" / "table5.md").read_text()
    assert "75.0 (1/3)" in written and "pape seed 1 failed" in written and "- nopos seed 2: no best.ckpt" in written


def test_a_frame_built_in_memory_counts_the_seeds_other_methods_hold():
    frame = _frame([*_rows("pape", 0, 75.0), *(row for s in range(3) for row in _rows("rope", s, 70.0))])
    frame = pd.concat([frame, _frame(_rows("sincos", 0, 65.0) + _rows("sincos", 1, 65.0) + _rows("sincos", 2, 65.0))])
    table5 = ex.extrapolation_tables(frame)["table5"]
    assert "| 75.0 (1/3) " in table5 and "**70.0**" in table5 and "<u>65.0</u>" in table5
    assert "pape seed 1 not evaluated, seed 2 not evaluated" in "\n".join(ex.extrapolation_notes(frame))


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
