"""Two ways a table cell looked right and was not: seeds of one method trained with other
method options averaged unmarked (†), and a seed stopped by the time cap ``trainer.max_time``
counted as a complete, ranked result (§)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from lightning.pytorch.callbacks import Callback, Timer
from test_tables import read_csv, stored
from tiny_grid import run_args

from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.harness.grid import runner as pe_runner
from pe_bench.harness.grid import store
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.reports import tables
from pe_bench.harness.reports.tables import write_tables


@pytest.fixture(autouse=True)
def _no_task_imports(monkeypatch):
    monkeypatch.setattr(tables, "_tiny_footnote", lambda tasks: "tiny profile: small stand-ins.")


# --- † : a method's own options compared across its seeds ----------------------------------


def test_seeds_of_one_method_with_other_options_are_marked_and_not_ranked(tmp_path):
    """The audit's case: rope/seed0 with the default base, seed1 with base=7.0 (``--set
    imagenet:methods.rope.base=7.0``) printed ``rope | 98.40 ± 0.85`` unmarked and ranked."""
    for seed in (0, 1):
        stored(tmp_path, "imagenet", "pape", seed, 90.0 + seed, options={"m": 8})  # its own options, every seed
    stored(tmp_path, "imagenet", "rope", 0, 97.8)
    stored(
        tmp_path, "imagenet", "rope", 1, 99.0, options={"base": 7.0}, methods={"pape": {"m": 8}, "rope": {"base": 7.0}}
    )
    stored(tmp_path, "imagenet", "nopos", 0, 10.0)
    stored(tmp_path, "imagenet", "nopos", 1, 12.0)
    markdown = write_tables(tmp_path)
    assert "| 98.40 ± 0.85 † " in markdown and "**98.40" not in markdown and "<u>98.40" not in markdown
    assert "**90.50 ± 0.71**" in markdown and "<u>11.00 ± 1.41</u>" in markdown  # ranked without rope
    assert (
        "† seeds of one method trained with other method options, averaged in one cell (not ranked): "
        "imagenet/rope/seed1: options.base=7.0 (seed0: absent)." in markdown
    )
    assert "another configuration than the rest of its task" not in markdown  # methods.* is per method
    rows = read_csv(tmp_path)
    assert rows[("imagenet", "rope")]["config_ok"] == "False" and rows[("imagenet", "pape")]["config_ok"] == "True"
    means, _, _ = tables.matrix(tables.load_results(tmp_path))
    assert means["Average"].isna()["rope"] and means.loc["pape", "Average"] == 90.5


def test_the_options_most_seeds_share_are_the_cells_and_the_others_are_named(tmp_path):
    for seed in (0, 2):
        stored(tmp_path, "imagenet", "rope", seed, 80.0, options={"base": 100.0})
    stored(tmp_path, "imagenet", "rope", 1, 81.0)
    stored(tmp_path, "imagenet", "rope", 3, 82.0, options={"base": 7.0})
    check = tables.check_configs(tables.load_results(tmp_path))
    assert check.outliers == {
        ("imagenet", "rope", 1): "options.base=absent (seeds 0, 2: 100.0)",
        ("imagenet", "rope", 3): "options.base=7.0 (seeds 0, 2: 100.0)",
    }
    assert check.option_differences == check.outliers and check.task_differences == {}
    # a cell differing in both ways carries both in its † entry
    stored(tmp_path, "imagenet", "rope", 4, 83.0, options={"base": 7.0}, model={"depth": 2})
    for seed in range(5):
        stored(tmp_path, "imagenet", "nopos", seed, 10.0)
    check = tables.check_configs(tables.load_results(tmp_path))
    assert check.outliers[("imagenet", "rope", 4)] == "model.depth=2 (others: 4), options.base=7.0 (seeds 0, 2: 100.0)"


def test_a_method_whose_seeds_share_their_options_is_not_marked(tmp_path):
    for seed in (0, 1):
        stored(tmp_path, "imagenet", "rope", seed, 80.0 + seed, options={"base": 7.0})
        stored(tmp_path, "imagenet", "pape", seed, 70.0 + seed, options={"m": 8})
    markdown = write_tables(tmp_path)
    assert "0.71 †" not in markdown and "seeds of one method" not in markdown and "**80.50 ± 0.71**" in markdown


def test_seeds_trained_under_another_default_of_an_option_are_marked(tmp_path):
    """``options`` holds only the options given: two seeds of plain ``rope`` trained before and
    after the code changed rope's default base look alike there. ``resolved_options`` (every
    option, defaults included) shows it; files written before it existed do not say."""
    now = pe_runner.resolved_config(load_run_config("imagenet", "tiny", {}), parse_method("rope"), {})
    assert now["options"] == {} and now["resolved_options"]["base"] == 100.0
    older_code = {**now, "resolved_options": {**now["resolved_options"], "base": 10.0}}
    before_the_section = {k: v for k, v in now.items() if k != "resolved_options"}
    for seed, cfg in enumerate((now, now, older_code, before_the_section)):
        stored(tmp_path, "imagenet", "rope", seed, 80.0 + seed, cfg=cfg)
    check = tables.check_configs(tables.load_results(tmp_path))
    assert check.outliers == {
        ("imagenet", "rope", 2): "resolved_options.base=10.0 (seeds 0, 1: 100.0)"
    }  # 3 does not say


# --- the runner: a new seed with other options than the stored seeds -----------------------


def _fake_cell(out, method, seed, options):
    """A finished cell on disk as check_consistency reads it (no training)."""
    directory = store.cell_dir(out, "imagenet", method, seed)
    store.write_record(directory, store.CellRecord("imagenet", method, seed, "tiny", "ok", score=50.0))
    requested = pe_runner.resolved_config(load_run_config("imagenet", "tiny", {}), parse_method(method), options)
    (directory / "config.yaml").write_text(yaml.safe_dump(requested))


def test_run_refuses_a_new_seed_with_other_options_than_the_stored_seeds(tmp_path, capsys):
    _fake_cell(tmp_path, "rope", 0, {})
    assert main(run_args(tmp_path, "rope", "--seeds", "1", "--set", "imagenet:methods.rope.base=7.0")) == 2
    err = capsys.readouterr().err
    assert "holds seeds of imagenet/rope trained with other options of rope" in err
    assert "options.base: absent stored, 7.0 requested (seed 0)" in err and "seed(s) 1 would be averaged" in err
    assert not store.cell_dir(tmp_path, "imagenet", "rope", 1).exists()


def test_a_new_seed_with_the_stored_seeds_options_is_accepted(tmp_path):
    _fake_cell(tmp_path, "rope", 0, {"base": 7.0})
    request = pe_runner.GridRequest(
        tasks=["imagenet"], methods=[parse_method("rope")], seeds=[1], out=tmp_path,
        task_overrides={"imagenet": {"methods": {"rope": {"base": 7.0}}}},
    )  # fmt: skip
    pe_runner.check_consistency(request)  # no error
    request.task_overrides = {}
    with pytest.raises(ValueError, match=r"options.base: 7.0 stored, absent requested \(seed 0\)"):
        pe_runner.check_consistency(request)
    request.seeds = [0]  # nothing to train: the same-seed check speaks (another configuration)
    with pytest.raises(ValueError, match="was trained with another configuration"):
        pe_runner.check_consistency(request)


# --- § : a seed cut short by the time cap ----------------------------------------------------


def cut(out, method, seed, score, ran=6.0, planned=40, stopped_by="trainer.max_time"):
    directory = stored(out, "imagenet", method, seed, score)
    record = store.read_record(directory)
    record.epochs_run, record.epochs_planned, record.stopped_by = ran, planned, stopped_by
    store.write_record(directory, record)


def test_a_cell_cut_short_by_the_time_cap_is_marked_and_not_ranked(tmp_path):
    """The audit's case: nopos ran 6 of 40 epochs, rope 3 of 40, both `ok`, and the table
    printed bold, underline and Average with no mark."""
    cut(tmp_path, "nopos", 0, 95.0, ran=6.0)
    cut(tmp_path, "rope", 0, 90.0, ran=3.5)
    stored(tmp_path, "imagenet", "pape", 0, 80.0)
    stored(tmp_path, "imagenet", "sincos", 0, 70.0)
    markdown = write_tables(tmp_path)
    assert "| 95.00 § " in markdown and "| 90.00 § " in markdown
    assert "**95.00" not in markdown and "<u>90.00" not in markdown
    assert "**80.00**" in markdown and "<u>70.00</u>" in markdown
    assert (
        "imagenet/nopos/seed0: 6 of 40 epochs, stopped by trainer.max_time; "
        "imagenet/rope/seed0: 3.5 of 40 epochs, stopped by trainer.max_time." in markdown
    )
    assert "§ a seed whose training stopped before its planned epochs" in markdown and "not in the Average" in markdown
    means, _, _ = tables.matrix(tables.load_results(tmp_path))
    assert means["Average"].isna()["nopos"] and means["Average"].isna()["rope"] and means.loc["pape", "Average"] == 80
    rows = read_csv(tmp_path)
    assert rows[("imagenet", "nopos")]["cut_short"] == "True" and rows[("imagenet", "pape")]["cut_short"] == "False"
    assert rows[("imagenet", "nopos")]["status"] == "ok"  # its seeds are held; it is not ranked
    latex = (tmp_path / "table.tex").read_text()
    assert r"95.00 $^\S$" in latex and "U+00A7" not in latex


def test_one_cut_seed_marks_its_cell(tmp_path):
    for seed in (0, 1):
        stored(tmp_path, "imagenet", "pape", seed, 80.0 + seed)
    stored(tmp_path, "imagenet", "rope", 0, 99.0)
    cut(tmp_path, "rope", 1, 98.0, ran=39.5, stopped_by="")  # short of its schedule, whatever stopped it
    markdown = write_tables(tmp_path)
    assert "| 98.50 ± 0.71 § " in markdown and "**80.50 ± 0.71**" not in markdown  # one ranked cell: none bold
    assert "imagenet/rope/seed1: 39.5 of 40 epochs." in markdown and "rope/seed0" not in markdown


def test_records_written_before_the_schedule_fields_read_as_complete(tmp_path):
    for method, score in (("pape", 80.0), ("rope", 70.0)):
        directory = stored(tmp_path, "imagenet", method, 0, score)
        payload = asdict(store.read_record(directory))
        for key in ("epochs_run", "epochs_planned", "stopped_by"):
            del payload[key]
        (directory / store.RECORD).write_text(json.dumps(payload))
        record = store.read_record(directory)
        assert record.epochs_run is None and record.stopped_by == "" and not record.cut_short
        assert store.read_cell(directory).finished
    markdown = write_tables(tmp_path)
    assert "**80.00**" in markdown and "<u>70.00</u>" in markdown and "§" not in markdown


def test_the_shipped_records_read_as_complete():
    records = store.load_records(Path(__file__).resolve().parents[2] / "results" / "reference" / "tiny-stop45")
    assert records and not any(r.cut_short for r in records)


def _trainer(steps, planned_steps=400, epochs=40, remaining=-1.0):
    timer = Timer(duration="00:00:00:08")
    timer.time_remaining = lambda stage="train": remaining
    return SimpleNamespace(
        max_epochs=epochs, estimated_stepping_batches=planned_steps, global_step=steps,
        current_epoch=steps * epochs // planned_steps, callbacks=[timer],
    )  # fmt: skip


def test_fit_length_counts_epochs_and_names_the_time_cap():
    assert pe_runner.fit_length(_trainer(65)) == {
        "epochs_run": 6.5,
        "epochs_planned": 40,
        "stopped_by": "trainer.max_time",
    }
    # the cap ran out at the last step: the schedule is complete
    assert pe_runner.fit_length(_trainer(400)) == {"epochs_run": 40.0, "epochs_planned": 40, "stopped_by": ""}
    assert pe_runner.fit_length(_trainer(399))["epochs_run"] == 39.9
    almost = pe_runner.fit_length(_trainer(3999, planned_steps=4000))  # floored: never reads as complete
    assert 39.98 <= almost["epochs_run"] < 40 and almost["stopped_by"] == "trainer.max_time"
    no_cap = _trainer(400)
    no_cap.callbacks = []
    assert pe_runner.fit_length(no_cap)["stopped_by"] == ""


def test_a_cell_stopped_by_the_time_cap_records_it_and_is_marked(tmp_path, monkeypatch):
    """End to end: the time cap ends nopos's fit after its first epoch (made to run out there,
    so the test does not depend on the machine's speed); rope trains its 3 epochs."""
    real = pe_runner.fit_trainer

    class RunOut(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            next(c for c in trainer.callbacks if isinstance(c, Timer))._duration = 0.0

    def fit_trainer(task, workdir, progress, run_name, grid, callbacks):
        return real(task, workdir, progress, run_name, grid, [*callbacks, *([RunOut()] if "nopos" in run_name else [])])

    monkeypatch.setattr(pe_runner, "fit_trainer", fit_trainer)
    args = run_args(tmp_path, "nopos,rope", "--set", "optim.epochs=3", "--set", "trainer.max_time=00:01:00:00")
    assert main(args) == 0
    nopos, rope = (store.read_record(store.cell_dir(tmp_path, "imagenet", m, 0)) for m in ("nopos", "rope"))
    assert nopos.status == "ok" and nopos.stopped_by == "trainer.max_time" and nopos.epochs_planned == 3
    assert 1 <= nopos.epochs_run < 3 and nopos.cut_short
    assert (rope.epochs_run, rope.epochs_planned, rope.stopped_by, rope.cut_short) == (3.0, 3, "", False)
    table = (tmp_path / "table.md").read_text()
    assert f"{nopos.score:.2f} §" in table and "imagenet/nopos/seed0: " in table
    assert not (store.cell_dir(tmp_path, "imagenet", "nopos", 0) / pe_runner.FIT_LENGTH).exists()
