"""``pe-bench confusion``: a finished cell's test confusion matrix, checked against its score."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from pe_bench.harness.cli import main
from pe_bench.harness.grid import store
from pe_bench.harness.reports.confusion import CellConfusion, confusion_table
from pe_bench.tasks._shared.motion import MOTIONS

SMALL = [
    "--set", "optim.epochs=1", "--set", "data.train_size=48", "--set", "data.val_size=16",
    "--set", "data.test_size=40", "--set", "model.dim=32", "--set", "model.depth=1",
]  # fmt: skip


def test_table_sums_seeds_and_names_the_most_frequent_wrong_answer():
    names = ["a", "b", "c"]
    first = CellConfusion(0, torch.tensor([[3, 1, 0], [0, 2, 2], [0, 0, 4]]), 75.0, names)
    second = CellConfusion(1, torch.tensor([[4, 0, 0], [0, 1, 3], [1, 0, 3]]), 66.7, names)
    assert first.accuracy == pytest.approx(75.0)
    table = confusion_table([first, second])
    assert table.loc["b", "c"] == 5 and table.loc["a", "a"] == 7
    assert list(table["acc %"]) == [87.5, 37.5, 87.5]
    assert list(table["most often instead"]) == ["b", "c", "a"]
    with pytest.raises(ValueError, match="class lists"):
        confusion_table([first, CellConfusion(2, first.matrix, 75.0, ["x", "y", "z"])])


def test_confusion_command_end_to_end(tmp_path, capsys):
    assert (
        main(["run", "--tasks", "ucf101", "--methods", "abspos", "--seeds", "0,1", "--out", str(tmp_path), *SMALL]) == 0
    )
    capsys.readouterr()
    assert main(["confusion", "--task", "ucf101", "--method", "abspos", "--seeds", "0,1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "most often instead" in printed and "orbit-ccw" in printed
    target = tmp_path / "confusion" / "ucf101" / "abspos"
    for seed in (0, 1):
        frame = pd.read_csv(target / f"seed{seed}.csv", index_col=0)
        assert list(frame.columns) == list(MOTIONS) and int(frame.to_numpy().sum()) == 40  # every test clip once
        record = store.read_record(store.cell_dir(tmp_path, "ucf101", "abspos", seed))
        # the matrix's accuracy is the cell's recorded test score, printed per seed
        assert 100.0 * frame.to_numpy().trace() / 40 == pytest.approx(record.score, abs=1e-3)
        assert f"seed {seed} {record.score:.2f} %" in printed


def test_confusion_refuses_a_checkpoint_that_does_not_explain_the_score(tmp_path, capsys):
    assert main(["run", "--tasks", "ucf101", "--methods", "nopos", "--out", str(tmp_path), *SMALL]) == 0
    result = store.cell_dir(tmp_path, "ucf101", "nopos", 0) / "result.json"
    payload = json.loads(result.read_text())
    payload["score"] += 10.0  # as if best.ckpt were another training's
    result.write_text(json.dumps(payload))
    capsys.readouterr()
    assert main(["confusion", "--task", "ucf101", "--method", "nopos", "--out", str(tmp_path)]) == 2
    assert "is not the recorded score" in capsys.readouterr().err
    payload.update(status="failed", score=None)  # a failed cell that left a checkpoint behind
    result.write_text(json.dumps(payload))
    assert main(["confusion", "--task", "ucf101", "--method", "nopos", "--out", str(tmp_path)]) == 2
    assert "the cell did not finish (failed)" in capsys.readouterr().err
    assert main(["confusion", "--task", "ucf101", "--method", "rope", "--out", str(tmp_path)]) == 2
    assert "no finished cell with a checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("task", ["ucf101", "dvsgesture"])
def test_generated_motion_tasks_name_their_classes(task):
    from pe_bench.harness.config import load_run_config
    from pe_bench.tasks.base import get_task

    config = load_run_config(task, "tiny")
    assert get_task(task)(config).class_names() == list(MOTIONS)
    assert get_task("imagenet")(load_run_config("imagenet", "tiny")).class_names() is None
