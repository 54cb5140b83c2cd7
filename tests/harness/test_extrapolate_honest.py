"""`pe-bench extrapolate`'s tables follow the result matrix's rules for seeds cut short (§) and
seeds stored ``ok`` with a non-finite score (no trained seed), as harness/reports/tables.py does."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import yaml

from pe_bench.harness.grid import store
from pe_bench.harness.reports import extrapolate as ex
from pe_bench.harness.reports import tables

CUT = {"epochs_run": 3.0, "epochs_planned": 40, "stopped_by": "trainer.max_time"}


def _stored(out, method, seed, score=50.0, **schedule):
    """A trained cell on disk as `pe-bench run` leaves it (an empty best.ckpt: never loaded here)."""
    directory = store.cell_dir(out, "imagenet", method, seed)
    record = store.CellRecord(
        task="imagenet", method=method, seed=seed, profile="tiny", status="ok", metric="acc",
        metric_label="Acc. (%)", score=score, **schedule,
    )  # fmt: skip
    store.write_record(directory, record)
    config = {
        "task": "imagenet", "profile": "tiny", "model": {"dim": 32, "depth": 1, "num_heads": 4},
        "optim": {"lr": 0.002, "epochs": 2}, "data": {"image_size": 24}, "method": method,
        "encoding": method, "options": {},
    }  # fmt: skip
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    (directory / "best.ckpt").write_bytes(b"")


def _frame(out, accuracy):
    """The frame `evaluate_grid` builds: one 24² row per evaluable cell and setting."""
    cells = ex.finished_cells(out, "imagenet", None)
    rows = [
        (c.method, c.seed, "24²", 576, interpolate, accuracy[c.method]) for c in cells for interpolate in (False, True)
    ]
    frame = pd.DataFrame(rows, columns=["method", "seed", "resolution", "pixels", "interpolation", "accuracy"])
    frame.attrs.update(ex.seed_context(out, "imagenet", None, cells))
    return frame


def _only_complete_cells_ranked(result: dict[str, str], shown: list[str], unranked: list[str]) -> None:
    """Tables 5 and 7 show the marked cells as ``shown``, never bold or underline the
    ``unranked`` values, and rank the complete cells: sincos/rope 80.0 bold, abspos 70.0 next."""
    for name in ("table5", "table7"):
        table = result[name]
        assert all(text in table for text in shown), table
        assert not any(f"{mark}{value}" in table for value in unranked for mark in ("**", "<u>")), table
        assert "**80.0**" in table and "<u>70.0</u>" in table, table


def test_a_seed_cut_short_marks_its_cell_section_and_is_not_ranked(tmp_path):
    """pape seed 1 stopped by trainer.max_time after 3 of 40 epochs: the matrix shows
    `90.50 ± 0.71 §` unranked, but the extrapolation tables bolded pape's 95.0 with no mark and
    no note. Now: `§`, never bold or underlined, and a note naming the seed and how far it got;
    the complete cells stay ranked."""
    for seed in (0, 1):
        _stored(tmp_path, "rope", seed)
        _stored(tmp_path, "abspos", seed)
        _stored(tmp_path, "pape", seed, **(CUT if seed == 1 else {}))
    _stored(tmp_path, "nopos", 0, epochs_run=1.5, epochs_planned=2)  # short without stopped_by
    _stored(tmp_path, "nopos", 1)
    matrix = tables.render(tables.load_results(tmp_path))
    assert f"50.00 ± 0.00 {tables.CUT_MARK}" in matrix  # the matrix's own rule, mirrored below
    frame = _frame(tmp_path, {"pape": 95.0, "nopos": 99.0, "rope": 80.0, "abspos": 70.0})
    result = ex.extrapolation_tables(frame)
    _only_complete_cells_ranked(result, ["| 95.0 § ", "| 99.0 § "], ["95.0", "99.0"])
    assert "| 95.0 (+0.0) § " in result["table6"] and "**80.0 (+0.0)**" in result["table6"]
    assert "<u>70.0 (+0.0)</u>" in result["table6"]
    notes = "\n".join(ex.extrapolation_notes(frame))
    assert "§ a seed whose training stopped before its planned epochs" in notes
    assert "pape seed 1: 3 of 40 epochs, stopped by trainer.max_time" in notes
    assert "nopos seed 0: 1.5 of 2 epochs" in notes
    assert "or a seed cut short (§) is never marked" in notes
    assert "Missing seeds" not in notes  # every seed was evaluated
    ex.write_extrapolation(tmp_path, "imagenet", frame, "24²")
    written = (tmp_path / "extrapolation" / "imagenet" / "table5.md").read_text()
    assert "| 95.0 § " in written and "pape seed 1: 3 of 40 epochs, stopped by trainer.max_time" in written


def test_a_seed_stored_ok_with_a_non_finite_score_is_no_trained_seed(tmp_path):
    """pape seed 1 stored ok with a NaN score (rope seed 1 with inf): the matrix counts each as
    diverged (`90.00 (1/2)`), but the extrapolation evaluated them and showed pape's `**95.0**`
    as complete. Now they are not evaluated, their cells show (held/asked), unranked, and the
    notes name the seeds as diverged with their stored score."""
    for seed in (0, 1):
        _stored(tmp_path, "abspos", seed)
        _stored(tmp_path, "sincos", seed)
    _stored(tmp_path, "pape", 0)
    _stored(tmp_path, "pape", 1, score=math.nan)
    _stored(tmp_path, "rope", 0)
    _stored(tmp_path, "rope", 1, score=math.inf)
    assert "50.00 (1/2)" in tables.render(tables.load_results(tmp_path))  # the matrix's own rule
    evaluated = {(c.method, c.seed) for c in ex.finished_cells(tmp_path, "imagenet", None)}
    assert ("pape", 1) not in evaluated and ("rope", 1) not in evaluated and ("pape", 0) in evaluated
    assert ex.cells_without_checkpoint(tmp_path, "imagenet", None) == []  # not "trained, no checkpoint"
    frame = _frame(tmp_path, {"pape": 95.0, "rope": 90.0, "sincos": 80.0, "abspos": 70.0})
    result = ex.extrapolation_tables(frame)
    _only_complete_cells_ranked(result, ["| 95.0 (1/2) ", "| 90.0 (1/2) "], ["95.0", "90.0"])
    assert "| 95.0 (+0.0) (1/2) " in result["table6"] and "**80.0 (+0.0)**" in result["table6"]
    notes = "\n".join(ex.extrapolation_notes(frame))
    assert "2 seed(s) asked for (0, 1)" in notes
    assert "Missing seeds: " in notes
    assert "pape seed 1 diverged (stored score nan)" in notes and "rope seed 1 diverged (stored score inf)" in notes


def test_each_data_configuration_is_scored_on_its_own_test_set(monkeypatch):
    """Test sets at other resolutions are made once per data configuration: a cell trained on
    held-out placements was scored on the first cell's regenerated set, 4 % of whose images
    hold placements it trained on (audit, stop 71)."""
    import torch

    from pe_bench.harness.config import load_run_config
    from pe_bench.harness.reports import extrapolate as ex
    from pe_bench.tasks import get_task
    from pe_bench.tasks.image.task import ImageDataModule

    configs = {
        0: load_run_config("imagenet", "tiny"),
        1: load_run_config("imagenet", "tiny", {"data": {"held_out_pairs": 0.25}}),
    }

    class Blind(torch.nn.Module):
        position_scale = 1.0

        def forward(self, x):
            return torch.zeros(len(x), 8)

    def load_cell(directory, data_root):
        return get_task("imagenet")(configs[int(directory.name)], None), Blind(), "rope"

    built, used = {}, []
    make, load = ImageDataModule.test_set_at, ImageDataModule.loader

    def test_set_at(self, height, width):
        made = make(self, height, width)
        built[id(made)] = self.data.held_out_pairs
        return made

    def loader(self, dataset, *args, **kwargs):
        used.append((self.data.held_out_pairs, id(dataset)))
        return load(self, dataset, *args, **kwargs)

    monkeypatch.setattr(ex, "load_cell", load_cell)
    monkeypatch.setattr(
        ex, "evaluable_cells", lambda out, task, methods: ([ex.Cell("sincos", s, Path(str(s))) for s in (0, 1)], [])
    )
    monkeypatch.setattr(ex, "seed_context", lambda *args: {})
    monkeypatch.setattr(ImageDataModule, "test_set_at", test_set_at)
    monkeypatch.setattr(ImageDataModule, "loader", loader)
    ex.evaluate_grid(Path("unused"), "imagenet", [(48, 48)], say=lambda line: None)
    other = [(mine, built[dataset]) for mine, dataset in used if dataset in built]  # the 48² sets
    assert sorted(other) == [(0.0, 0.0), (0.25, 0.25)]
