"""``pe-bench reproduce``: a stored cell's first epochs trained again, compared bit for bit."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from pe_bench.harness.cli import main
from pe_bench.harness.grid import store
from pe_bench.harness.grid.reproduce import compare_rows, environment_differences, stored_cells

SMALL = ["optim.epochs=3", "data.train_size=64", "data.val_size=16", "data.test_size=16", "model.dim=32",
         "model.depth=1", "optim.batch_size=16"]  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("results")
    argv = ["run", "--tasks", "imagenet", "--methods", "rope", "--out", str(out), "--no-progress"]
    assert main(argv + [arg for override in SMALL for arg in ("--set", override)]) == 0
    return out


def rows(cell: Path) -> list[dict[str, str]]:
    with (cell / "metrics.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_stored_cell_reproduces_bit_for_bit(results: Path, capsys) -> None:
    cell = store.cell_dir(results, "imagenet", "rope", 0)
    stored = rows(cell)
    # The learning rate changes every epoch with the 3-epoch schedule: equal rows mean the
    # shortened fit kept the cell's schedule.
    assert len({row["lr"] for row in stored}) == 3
    assert main(["reproduce", str(cell), "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "identical  imagenet · rope · seed 0: 2 epoch(s)" in out and "1 identical, 0 differ" in out
    assert rows(cell) == stored  # the stored cell is not touched


def test_a_changed_number_or_environment_is_reported(results: Path, tmp_path: Path, capsys) -> None:
    import shutil

    cell = tmp_path / "runs" / "imagenet" / "rope" / "seed0"
    shutil.copytree(store.cell_dir(results, "imagenet", "rope", 0), cell)
    stored = rows(cell)
    loss = float(stored[0]["train/loss"])
    stored[0]["train/loss"] = repr(loss * (1 + 1e-7))  # one rounding step off, as another machine would be
    with (cell / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(stored[0]))
        writer.writeheader()
        writer.writerows(stored)
    env = json.loads((cell / "env.json").read_text())
    (cell / "env.json").write_text(json.dumps(env | {"python": "3.0.0"}))
    assert main(["reproduce", str(tmp_path), "--epochs", "1"]) == 1
    out = capsys.readouterr().out
    assert "differs    imagenet · rope · seed 0:" in out and "train/loss differs from epoch 1" in out
    assert "python: stored 3.0.0" in out and "0 identical, 1 differ" in out


def test_filters_and_bad_paths(results: Path, tmp_path: Path, capsys) -> None:
    assert stored_cells([results]) == [store.cell_dir(results, "imagenet", "rope", 0)]
    assert main(["reproduce", str(results), "--methods", "pape"]) == 2
    assert "no stored cell matches" in capsys.readouterr().err
    assert main(["reproduce", str(tmp_path / "typo")]) == 2
    assert "neither a cell folder" in capsys.readouterr().err


def test_row_comparison() -> None:
    stored = [{"epoch": "1", "train/loss": "0.5", "lr": "0.1", "seconds": "3.0"}]
    assert compare_rows(stored, [{"epoch": "1", "train/loss": "0.50", "lr": "0.1", "seconds": "9.0"}], 1) == (1, [])
    _, lines = compare_rows(stored, [{"epoch": "1", "train/loss": "0.5", "seconds": "3.0"}], 1)
    assert lines == ["lr differs from epoch 1: stored 0.1, now None"]  # a column one side lacks differs
    _, lines = compare_rows(stored * 2, [], 2)
    assert lines == ["trained 0 of 2 epochs"]


def test_environment_comparison_skips_what_old_records_lack() -> None:
    stored = {"python": "3.11.7", "packages": {"torch": "2.14.1"}, "git_sha": "a" * 40, "torch_threads": 1}
    now = stored | {"packages": {"torch": "2.14.1", "babel": "2.18.0"}, "git_sha": "b" * 40}
    assert environment_differences(stored, now) == ["code: stored aaaaaaa, now bbbbbbb"]
    # records from stop 44 on name the CPU kernels' instruction set: another one sums in another order
    assert environment_differences(stored | {"cpu_kernels": "AVX2"}, now | {"cpu_kernels": "AVX512"}) == [
        "cpu_kernels: stored AVX2, now AVX512", "code: stored aaaaaaa, now bbbbbbb"]  # fmt: skip
    # and from stop 53 on the CPU itself: one instruction set, two CPUs, two roundings
    now_cpu = now | {"cpu_model": "family 6 model 207"}
    assert environment_differences(stored, now_cpu) == ["code: stored aaaaaaa, now bbbbbbb"]
    assert environment_differences(stored | {"cpu_model": "family 6 model 143"}, now_cpu) == [
        "cpu_model: stored family 6 model 143, now family 6 model 207",
        "code: stored aaaaaaa, now bbbbbbb",
    ]


def test_the_cpu_model_is_read_from_proc_cpuinfo(monkeypatch, tmp_path) -> None:
    from pe_bench.harness.grid import store

    assert store.environment()["cpu_model"] == store.cpu_model()
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n\nprocessor\t: 1\n")
    real_path = store.Path
    monkeypatch.setattr(store, "Path", lambda p: info if p == "/proc/cpuinfo" else real_path(p))
    assert store.cpu_model() == "family 6 model 207"
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # e.g. aarch64: no family or model
    assert store.cpu_model() is None


def test_a_cell_whose_data_is_missing_is_skipped_with_the_reason(results: Path, monkeypatch, capsys) -> None:
    from pe_bench.tasks import get_task

    def missing(self, full=False, workers=1):
        raise FileNotFoundError("imagenet: /data/imagenet lacks train/ (expected DATA_ROOT/imagenet/{train,val}/)")

    monkeypatch.setattr(get_task("imagenet"), "check_data", missing)
    assert main(["reproduce", str(results)]) == 1  # nothing reproduced is no evidence
    out = capsys.readouterr().out
    assert "skipped    imagenet · rope · seed 0: imagenet: /data/imagenet lacks train/" in out
    assert "0 identical, 0 differ, 1 skipped" in out


def test_a_results_folder_leaves_out_its_na_cells(results: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(results / "runs", tmp_path / "runs")
    na = store.CellRecord(task="imagenet", method="lookhere", seed=0, profile="tiny", status=store.STATUS_NA,
                          reason="not defined for these positions")  # fmt: skip
    store.write_record(store.cell_dir(tmp_path, "imagenet", "lookhere", 0), na)
    assert stored_cells([tmp_path]) == [store.cell_dir(tmp_path, "imagenet", "rope", 0)]
