"""``pe-bench --version``, ``run --help`` and ``run --dry-run`` (the plan of a grid, no training)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from pe_bench import __version__
from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.harness.grid import store
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.grid.runner import resolved_config


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"pe-bench {__version__}"


def test_run_help_explains_seeds_profiles_and_overrides(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "comma-separated seeds, e.g. 0,1,2 (default: 0)" in text
    assert "tiny (default)" in text and "paper:" in text and "--data-root" in text
    assert "imagenet:optim.lr=1e-3" in text and "--dry-run" in text


def _finished(out, method, status=store.STATUS_OK, **model):
    cell = store.cell_dir(out, "imagenet", method, 0)
    config = load_run_config("imagenet", "tiny", {"model": model} if model else None)
    cell.mkdir(parents=True)
    (cell / "config.yaml").write_text(yaml.safe_dump(resolved_config(config, parse_method(method), {})))
    record = store.CellRecord("imagenet", method, 0, "tiny", status, metric_label="Acc. (%)", score=50.0,
                              reason="" if status == store.STATUS_OK else "RuntimeError: boom")  # fmt: skip
    store.write_record(cell, record)


def test_dry_run_plans_every_cell_and_trains_nothing(tmp_path, capsys):
    _finished(tmp_path, "nopos")
    _finished(tmp_path, "rope", status=store.STATUS_FAILED)
    _finished(tmp_path, "sincos", dim=8)  # another configuration than the one asked for
    before = sorted(p for p in tmp_path.rglob("*"))
    methods = "nopos,rope,sincos,abspos"
    code = main(["run", "--tasks", "imagenet,modelnet40", "--methods", methods, "--out", str(tmp_path), "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 2  # the real run would stop at the sincos cell
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written, nothing trained
    assert "  reuse    imagenet · nopos · seed 0  (finished: Acc. (%) 50.00)" in lines
    assert "  retry    imagenet · rope · seed 0  (last time failed: RuntimeError: boom)" in lines
    assert any(line.startswith("  conflict imagenet · sincos · seed 0  (trained with another configuration: "
                               "model.dim: 8 stored, ") for line in lines)  # fmt: skip
    assert "  train    imagenet · abspos · seed 0" in lines and "  train    modelnet40 · rope · seed 0" in lines
    assert "would do: 4 train, 1 retry, 1 reuse, 1 n/a, 1 conflict" in lines  # abspos has no 3-D table
    assert any(line.startswith("  n/a      modelnet40 · abspos · seed 0  (") for line in lines)


def test_dry_run_says_retry_where_the_run_would_train_again(tmp_path, capsys):
    """An ok record without its config.yaml, or holding no finite score, is retrained by the
    run (store.read_cell): the dry run says retry with the reason, not reuse."""
    _finished(tmp_path, "nopos")
    (store.cell_dir(tmp_path, "imagenet", "nopos", 0) / "config.yaml").unlink()
    _finished(tmp_path, "rope")
    cell = store.cell_dir(tmp_path, "imagenet", "rope", 0)
    store.write_record(cell, dataclasses.replace(store.read_record(cell), score=float("nan")))
    assert not store.read_cell(cell).finished
    code = main(["run", "--tasks", "imagenet", "--methods", "nopos,rope", "--out", str(tmp_path), "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert "  retry    imagenet · nopos · seed 0  (its config.yaml is missing)" in lines
    assert "  retry    imagenet · rope · seed 0  (its result.json is ok but holds no finite score (nan))" in lines


def test_dry_run_plans_with_the_threads_the_executor_would_store(tmp_path, capsys):
    """``--jobs N`` cells run (and are stored) with the executor's CPU threads: the dry run of
    the same command must see them as reusable, as the real run does, not as conflicts."""
    from pe_bench.harness.grid.executor import ParallelExecutor

    threads = ParallelExecutor(2).cell_threads(None)
    cell = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    config = load_run_config("imagenet", "tiny", {"trainer": {"threads": threads}})
    cell.mkdir(parents=True)
    (cell / "config.yaml").write_text(yaml.safe_dump(resolved_config(config, parse_method("nopos"), {})))
    store.write_record(cell, store.CellRecord("imagenet", "nopos", 0, "tiny", store.STATUS_OK, score=50.0))
    command = ["run", "--tasks", "imagenet", "--methods", "nopos", "--out", str(tmp_path), "--dry-run"]
    assert main([*command, "--jobs", "2"]) == 0
    assert "would do: 1 reuse" in capsys.readouterr().out
    if threads != (load_run_config("imagenet", "tiny").trainer.threads or None):  # the check can fail
        assert main(command) == 2  # one process: the profile's threads, another configuration
