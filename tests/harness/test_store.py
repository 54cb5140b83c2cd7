"""The results store: damaged records and configs never block a table or a grid, and never
stand in for a result; old records stay readable."""

from __future__ import annotations

import json
from dataclasses import asdict

import yaml
from tiny_grid import run_args

from pe_bench.harness.cli import main
from pe_bench.harness.grid import store


def ok_record(method: str, score: float = 50.0) -> store.CellRecord:
    return store.CellRecord(
        task="imagenet", method=method, seed=0, profile="tiny", status="ok",
        metric="acc", metric_label="Acc. (%)", score=score,
    )  # fmt: skip


def test_old_and_newer_records_stay_readable(tmp_path):
    cell = store.cell_dir(tmp_path, "imagenet", "rope", 0)
    cell.mkdir(parents=True)
    payload = asdict(ok_record("rope"))
    del payload["trained_by"], payload["best_epoch"]  # written before these fields existed
    payload["written_by_a_later_version"] = {"x": 1}
    (cell / "result.json").write_text(json.dumps(payload))
    record = store.read_record(cell)
    assert record.method == "rope" and record.score == 50.0
    assert record.trained_by == {} and record.best_epoch is None


def test_damaged_records_are_reported_with_their_path_and_left_out(tmp_path, capsys):
    good = store.cell_dir(tmp_path, "imagenet", "rope", 0)
    store.write_record(good, ok_record("rope"))
    damaged = {
        "truncated": json.dumps(asdict(ok_record("x")))[:40],
        "empty-object": "{}",
        "a-list": "[1, 2]",
        "bad-status": json.dumps(asdict(ok_record("x")) | {"status": "finished"}),
        "bad-seed": json.dumps(asdict(ok_record("x")) | {"seed": "zero"}),
    }
    for method, text in damaged.items():
        cell = store.cell_dir(tmp_path, "imagenet", method, 0)
        cell.mkdir(parents=True)
        (cell / "result.json").write_text(text)
    assert [r.method for r in store.load_records(tmp_path)] == ["rope"]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(damaged)
    for method in damaged:
        path = store.cell_dir(tmp_path, "imagenet", method, 0) / "result.json"
        assert sum(str(path) in line and "is damaged" in line for line in lines) == 1, method
    assert store.read_cell(store.cell_dir(tmp_path, "imagenet", "truncated", 0)).finished is False
    store.load_records(tmp_path)
    assert capsys.readouterr().err == ""  # each damaged file is reported once per process


def test_table_is_rendered_despite_damaged_records(tmp_path, capsys):
    good = store.cell_dir(tmp_path, "imagenet", "rope", 0)
    store.write_record(good, ok_record("rope", 61.5))
    (good / "config.yaml").write_text(yaml.safe_dump({"task": "imagenet", "model": {"dim": 32}}))  # as every cell has
    broken = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    broken.mkdir(parents=True)
    (broken / "result.json").write_text('{"task": "imagenet", "meth')
    assert main(["table", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "61.5" in captured.out and "nopos" not in captured.out
    assert captured.err.count("\n") == 1 and str(broken / "result.json") in captured.err


def test_cell_without_its_config_is_retrained_not_reused(tmp_path, capsys):
    """Without config.yaml the configuration check cannot be made: the cell is trained again,
    with what is asked now."""
    assert main(run_args(tmp_path, "nopos")) == 0
    cell = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    (cell / "config.yaml").unlink()
    capsys.readouterr()
    assert main(run_args(tmp_path, "nopos", "--set", "optim.lr=0.0123")) == 0
    out = capsys.readouterr().out
    assert "re-running: its config.yaml is missing" in out and "finished earlier" not in out
    assert yaml.safe_load((cell / "config.yaml").read_text())["optim"]["lr"] == 0.0123


def test_run_redoes_cells_whose_record_or_config_is_damaged(tmp_path, capsys):
    assert main(run_args(tmp_path, "nopos,rope")) == 0
    nopos, rope = (store.cell_dir(tmp_path, "imagenet", m, 0) for m in ("nopos", "rope"))
    (nopos / "result.json").write_text((nopos / "result.json").read_text()[:50])
    (rope / "config.yaml").write_text("model: [unclosed\n  : :")
    capsys.readouterr()
    assert main(run_args(tmp_path, "nopos,rope")) == 0
    captured = capsys.readouterr()
    assert "nopos · seed 0: re-running: its result.json is damaged" in captured.out
    assert "rope · seed 0: re-running: its config.yaml is damaged" in captured.out
    assert str(nopos / "result.json") in captured.err and str(rope / "config.yaml") in captured.err
    assert "Traceback" not in captured.err
    assert store.read_cell(nopos).finished and store.read_cell(rope).finished
