"""Test-split confusion matrices of finished classification cells (``pe-bench confusion``).

A score says how often a model is right; which wrong class it picks says why. On the tiny
ucf101 with held-out paths, for instance, a score below chance says the answers on unseen paths
are systematic, and only the matrix says which class they go to.

The matrix is recomputed from a cell's ``best.ckpt`` on its own test split, through the same
logits its test step scored (test-time augmentation included). Its accuracy must then be the
cell's recorded test score: where it is not, the checkpoint, the data or the code differ from
those that made the cell, and the matrix is refused rather than shown beside a score it does
not explain.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torchmetrics.classification import MulticlassConfusionMatrix

from pe_bench.harness.grid.store import read_record
from pe_bench.harness.module import ClassificationModule

from .extrapolate import load_cell

#: recomputed and recorded test accuracy (%) may differ by this much: the recorded one is
#: torchmetrics' float32 ratio, the recomputed one an exact count
SCORE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class CellConfusion:
    """One cell's test confusion: ``matrix[i, j]`` counts test samples of class i predicted j."""

    seed: int
    matrix: torch.Tensor  # (C, C) int64
    recorded_score: float
    class_names: list[str]

    @property
    def accuracy(self) -> float:
        return 100.0 * float(self.matrix.diagonal().sum()) / max(int(self.matrix.sum()), 1)


def cell_confusion(directory: Path, data_root: Path | None = None) -> CellConfusion:
    """The test confusion matrix of the finished cell in ``directory`` (see module doc)."""
    record = read_record(directory) if (directory / "best.ckpt").is_file() else None
    if record is None:
        raise FileNotFoundError(
            f"no finished cell with a checkpoint at {directory} (needs result.json and best.ckpt); "
            "run `pe-bench run` for it first"
        )
    if record.status != "ok" or record.score is None:
        raise ValueError(f"{directory}: the cell did not finish ({record.status}); it has no test score to explain")
    task, model, _ = load_cell(directory, data_root)
    module = task.lightning_module(model)
    if not isinstance(module, ClassificationModule):
        raise ValueError(f"{directory}: task {task.name!r} is not a classification task; a confusion matrix needs one")
    num_classes = task.data.num_classes
    names = task.class_names() or [str(i) for i in range(num_classes)]
    data = task.datamodule(seed=record.seed)
    data.setup("test")
    confusion = MulticlassConfusionMatrix(num_classes)
    with torch.inference_mode():
        for inputs, labels in data.test_dataloader():
            if module.test_time_augmentation is None:
                logits = model(inputs)
            else:
                logits = module.test_time_augmentation(model, inputs)
            confusion.update(logits.argmax(-1), labels)
    cell = CellConfusion(record.seed, confusion.compute().long(), record.score, names)
    if abs(cell.accuracy - cell.recorded_score) > SCORE_TOLERANCE:
        raise ValueError(
            f"{directory}: the checkpoint's recomputed test accuracy {cell.accuracy:.4f} is not the recorded score "
            f"{cell.recorded_score:.4f}; the checkpoint, the data or the code differ from those that made the cell "
            "(retrain it with `pe-bench run`, or check out the commit in its env.json)"
        )
    return cell


def _matrix_frame(matrix: torch.Tensor, names: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame(matrix.numpy(), index=names, columns=names)
    frame.index.name = "true \\ predicted"
    return frame


def confusion_table(cells: list[CellConfusion]) -> pd.DataFrame:
    """The cells' matrices summed (rows: true class, columns: predicted), with each class's
    accuracy and its most frequent wrong answer."""
    names = cells[0].class_names
    if any(c.class_names != names for c in cells):
        raise ValueError("the cells have different class lists; compare cells of one task and configuration")
    total = torch.stack([c.matrix for c in cells]).sum(0)
    frame = _matrix_frame(total, names)
    wrong = total.clone()
    wrong.fill_diagonal_(-1)
    frame["acc %"] = (100.0 * total.diagonal() / total.sum(1).clamp(min=1)).numpy().round(1)
    frame["most often instead"] = [
        names[int(row.argmax())] if int(row.max()) > 0 else "-" for row in wrong
    ]  # fmt: skip
    return frame


def write_confusion(cells: list[CellConfusion], target: Path) -> str:
    """Each cell's matrix as ``seed<N>.csv`` under ``target``; returns the summed table as Markdown."""
    target.mkdir(parents=True, exist_ok=True)
    for cell in cells:
        _matrix_frame(cell.matrix, cell.class_names).to_csv(target / f"seed{cell.seed}.csv")
    per_seed = ", ".join(f"seed {c.seed} {c.accuracy:.2f} %" for c in cells)
    return f"test accuracy: {per_seed} (each the cell's recorded score)\n\n" + confusion_table(cells).to_markdown()
