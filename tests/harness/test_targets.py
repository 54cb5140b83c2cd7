"""``pe-bench bench --targets``: issue 16's targets judged from GPU runs' rows, and the README's
copy of that table for the shipped runs."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from pe_bench.harness.cli import main
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.reports import targets
from pe_bench.harness.reports.targets import (
    CUDA_CHANGES,
    default_folders,
    load_run,
    load_runs,
    targets_markdown,
    targets_table,
)

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def test_readme_targets_table_is_the_commands_output_on_the_shipped_runs():
    table = targets_markdown(load_runs(default_folders(ROOT)))
    readme = (ROOT / "README.md").read_text()
    assert table in readme, "README's issue-16 targets table is not `pe-bench bench --targets`'s output: paste it again"


def test_shipped_runs_name_their_code_as_git_does():
    if _git("rev-parse", "HEAD") is None:
        pytest.skip("no git checkout")
    for folder in default_folders(ROOT):
        run = load_run(folder)
        committed = _git("log", "-1", "--format=%cI", run.code)
        assert committed is not None, f"{folder.name}: commit {run.code} is not in this repository"
        assert datetime.fromisoformat(committed) == datetime.fromisoformat(run.code_committed), folder.name


def test_listed_changes_are_commits_of_this_repository_with_their_dates():
    if _git("rev-parse", "HEAD") is None:
        pytest.skip("no git checkout")
    for change in CUDA_CHANGES:
        committed = _git("log", "-1", "--format=%cI", change.commit)
        assert committed is not None, f"{change.commit} ({change.what}) is not in this repository"
        assert datetime.fromisoformat(committed) == datetime.fromisoformat(change.committed), change.commit


def test_every_target_names_known_encodings_and_every_change_names_target_encodings():
    judged = {method for target in targets.targets() for method in target.methods}
    for method in judged - {"timm"}:
        parse_method(method)  # raises, naming the method, if it is unknown
    for change in CUDA_CHANGES:
        assert set(change.methods) <= judged, change


def _run(folder: Path, code_committed: str, rows: list[dict], sweep: list[dict] = (), **meta) -> Path:
    folder.mkdir(parents=True)
    run = {"gpu": "NVIDIA X1", "torch": "2.11.0", "date": code_committed[:10], "code": "abc1234"}
    (folder / "run.json").write_text(json.dumps({**run, "code_committed": code_committed, **meta}))
    (folder / "throughput_rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "sweep_rows.jsonl").write_text("".join(json.dumps(point) + "\n" for point in sweep))
    return folder


def _row(method: str, ratio: float, img_s: float = 1000.0) -> dict:
    return {
        "method": method,
        "kernel": "CUDNN_ATTENTION",
        "train_img_s_b128": img_s,
        "train_img_s_b128_vs_nopos": ratio,
    }


def _judged(table, target_name: str, method: str) -> dict:
    rows = table[(table["target"] == target_name) & (table["encoding"] == method)]
    assert len(rows) == 1, (target_name, method)
    return rows.iloc[0].to_dict()


def test_each_encoding_is_judged_on_the_newest_run_that_measured_it(tmp_path):
    old = _run(
        tmp_path / "old", "2026-11-01T00:00:00+00:00", [_row("nopos", 1.0), _row("rope", 1.30), _row("alibi", 1.2)]
    )
    new = _run(tmp_path / "new", "2026-12-01T00:00:00+00:00", [_row("nopos", 1.0), _row("rope", 1.05)])
    table = targets_table(load_runs([new, old]))  # the order given does not matter: the code's date does
    rope = _judged(table, "≤ 1.10× nopos", "rope")
    assert (rope["measured"], rope["status"], rope["run"]) == ("1.050× nopos", "met", "X1 2026-12-01 (abc1234)")
    alibi = _judged(table, "≤ 1.25× nopos", "alibi")  # only the old run measured it
    assert (alibi["status"], alibi["run"]) == ("met", "X1 2026-11-01 (abc1234)")
    assert _judged(table, "≤ 1.10× nopos", "rope-mixed")["status"] == "not measured"
    assert _judged(table, "≤ 1.25× nopos", "alibi")["since the run"] == targets.EARLIER_CHANGES


def test_limits_bounds_and_timm(tmp_path):
    rows = [_row("nopos", 1.0), _row("pape", 1.36), _row("relpos", 1.25), _row("timm", 0.98), _row("sincos", 1.16)]
    table = targets_table(load_runs([_run(tmp_path / "run", "2026-12-01T00:00:00+00:00", rows)]))
    assert _judged(table, "≤ 1.35× nopos", "pape")["status"] == "not met"
    assert _judged(table, "≤ 1.25× nopos", "relpos")["status"] == "met"  # the limit itself meets it
    timm = _judged(table, "nopos ≥ timm's ViT-B/16", "timm")
    assert (timm["measured"], timm["status"]) == ("nopos 0.980× timm's speed", "not met")
    sincos = _judged(table, "≤ 1.15× FLOP bound", "sincos")  # sincos's bound is 1.000 (an add per token channel)
    assert sincos["measured"].startswith("1.160 / 1.000 = 1.16") and sincos["status"] == "not met"


def test_a_form_measured_before_a_default_changed_is_named_and_bounded_as_that_form(tmp_path):
    from pe_bench.harness.reports.targets import _flop_bound

    rows = [_row("nopos", 1.0), _row("pape", 1.30)]
    run = _run(tmp_path / "run", "2026-12-01T00:00:00+00:00", rows, measured_as={"pape": "pape[space=projected]"})
    table = targets_table(load_runs([run]))
    pape = _judged(table, "≤ 1.15× FLOP bound", "pape")
    projected = _flop_bound("pape[space=projected]")
    assert projected != _flop_bound("pape[space=position]")
    assert pape["measured"] == f"1.300 / {projected:.3f} = {1.30 / projected:.2f}, as pape[space=projected]"
    assert _judged(table, "≤ 1.35× nopos", "pape")["measured"] == "1.300× nopos, as pape[space=projected]"


def test_the_first_runs_ratio_of_medians_and_a_failed_row(tmp_path):
    rows = [
        {"method": "nopos", "kernel": "CUDNN_ATTENTION", "train_img_s_b128": 2000.0},
        {"method": "rope", "kernel": "CUDNN_ATTENTION", "train_img_s_b128": 1600.0},
        {"method": "sape2", "kernel": "error: out of luck"},
        {"method": "cape", "kernel": "CUDNN_ATTENTION", "train_img_s_b64": 900.0},  # another batch: no figure here
    ]
    table = targets_table(load_runs([_run(tmp_path / "run", "2026-12-01T00:00:00+00:00", rows)]))
    assert _judged(table, "≤ 1.10× nopos", "rope")["measured"] == "1.250× nopos"
    sape2 = _judged(table, "≤ 1.15× FLOP bound", "sape2")
    assert (sape2["measured"], sape2["status"]) == ("error: out of luck", "failed")
    cape = _judged(table, "≤ 1.15× FLOP bound", "cape")
    assert (cape["measured"], cape["status"]) == ("no batch-128 training figure", "not measured")


def test_a_training_step_that_failed_alone_is_a_failed_row_not_a_crash(tmp_path):
    """Inference measured, the training step out of memory: the failure's text sits in the
    training cell (bench.failure_cell), which the ratio must not divide by (it did: TypeError,
    and every `.ci/gpu` part ending with the targets table lost it)."""
    rows = [
        {"method": "nopos", "kernel": "CUDNN_ATTENTION", "train_img_s_b128": 2000.0},
        {"method": "lookhere", "kernel": "FLEX", "train_img_s_b128": "OOM"},
    ]
    table = targets_table(load_runs([_run(tmp_path / "run", "2026-12-01T00:00:00+00:00", rows)]))
    lookhere = _judged(table, "≤ 1.15× FLOP bound", "lookhere")
    assert (lookhere["measured"], lookhere["status"]) == ("OOM", "failed")
    assert _judged(table, "≤ 1.25× nopos", "lookhere")["status"] == "failed"


def test_long_sequence_memory_below_one_heads_scores_is_linear(tmp_path):
    n = targets.LONG_SEQUENCE_TOKENS
    one_head_mib = n * n * 2 / 2**20
    sweep = [
        {"tokens": n, "method": "alibi", "peak_mib": 482.0, "ms": 2407.0, "status": "ok"},
        {"tokens": n, "method": "lookhere", "peak_mib": one_head_mib + 1, "ms": 10.0, "status": "ok"},
        {"tokens": n, "method": "relpos", "status": "OOM"},
        {"tokens": 16384, "method": "cope", "peak_mib": 100.0, "ms": 1.0, "status": "ok"},
    ]
    table = targets_table(load_runs([_run(tmp_path / "run", "2026-12-01T00:00:00+00:00", [], sweep)]))
    name = "65,536 tokens, linear memory"
    alibi = _judged(table, name, "alibi")
    assert (alibi["measured"], alibi["status"]) == ("482 MiB / 2,407.0 ms", "met")
    assert _judged(table, name, "lookhere")["status"] == "not met"
    assert (_judged(table, name, "relpos")["measured"], _judged(table, name, "relpos")["status"]) == ("OOM", "failed")
    assert _judged(table, name, "cope")["status"] == "not measured"  # a smaller point does not count


def test_changes_after_a_runs_code_are_listed_and_earlier_ones_not():
    change = next(c for c in CUDA_CHANGES if c.what == "the fused rotation")
    before, after = change.committed.replace("01:29:29", "01:29:28"), change.committed
    run = targets.GpuRun(Path("."), "X1", "t", "d", "c", before)
    assert change in run.changes_since("rope") and change not in run.changes_since("alibi")
    assert change not in targets.GpuRun(Path("."), "X1", "t", "d", "c", after).changes_since("rope")


def test_a_gpu_calls_output_folder_is_read_from_its_printed_lines(tmp_path):
    """A ``.ci/gpu`` call's ``$OUT``: rows in ``eager.txt`` and ``eager-rest.txt`` (default kernels), none from
    ``eager-unfused.txt`` (forced eager kernels), sweep points in ``sweep.txt``; ``run.json``
    as ``run_json`` writes it, so that no listed change counts as newer than the call."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps(targets.run_json("NVIDIA X1", "2.11.0", "deadbee")))
    (out / "eager.txt").write_text(
        "W1201 noise\n" + "".join(f"row: {json.dumps(row)}\n" for row in (_row("nopos", 1.0), _row("rope", 1.08)))
    )
    (out / "eager-unfused.txt").write_text(f"row: {json.dumps(_row('rope-mixed', 1.5))}\n")
    (out / "eager-rest.txt").write_text(f"row: {json.dumps(_row('wepe', 1.01))}\n")  # `.ci/gpu profile`'s rows
    point = {"tokens": targets.LONG_SEQUENCE_TOKENS, "method": "cope", "peak_mib": 900.0, "ms": 5.0, "status": "ok"}
    (out / "sweep.txt").write_text(f"sweep: {json.dumps(point)}\n")
    table = targets_table(load_runs([out]))
    rope = _judged(table, "≤ 1.10× nopos", "rope")
    assert (rope["status"], rope["since the run"]) == ("met", "")
    assert _judged(table, "≤ 1.10× nopos", "rope-mixed")["status"] == "not measured"
    assert _judged(table, "≤ 1.15× FLOP bound", "wepe")["status"] == "met"
    assert _judged(table, "65,536 tokens, linear memory", "cope")["status"] == "met"


def test_a_folder_without_run_json_or_rows_is_an_error_naming_what_it_needs(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run.json"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps(targets.run_json("NVIDIA X1", "2.11.0", "deadbee")))
    with pytest.raises(ValueError, match="no measured rows"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"gpu": "X1"}))
    with pytest.raises(ValueError, match="missing torch, date, code, code_committed"):
        load_run(tmp_path)


def test_bench_targets_prints_the_table_without_a_device(tmp_path, capsys):
    run = _run(tmp_path / "run", "2026-12-01T00:00:00+00:00", [_row("nopos", 1.0), _row("rope", 1.2)])
    assert main(["bench", "--device", "cuda", "--targets", str(run)]) == 0  # --device is not checked: nothing runs
    out = capsys.readouterr().out
    assert "## Issue 16's targets on the newest GPU run of each encoding (1 run)" in out
    assert "| ≤ 1.10× nopos" in out and "1.200× nopos" in out
