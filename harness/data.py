"""A LightningDataModule over ready-made train/val/test splits, shared by every task.

Tasks fill ``splits`` in ``setup`` and, for variable-size samples, set ``collate_fn``;
shuffling is seeded per cell so that a cell is reproducible. Validation and test loaders
read their whole split in order in every process, also under DDP (:class:`WholeSplit`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler


def cache_root() -> Path:
    """Where generated tiny data is kept between runs (written once, shared by every cell):
    ``$PE_BENCH_CACHE`` or ~/.cache/pe-bench."""
    return Path(os.environ.get("PE_BENCH_CACHE") or Path.home() / ".cache" / "pe-bench")


def package_version(package: str) -> str | None:
    """An installed distribution's version; None when it is not installed (or has no metadata).
    env.json's package list and the tasks' data fingerprints use it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


class DatasetMissingError(FileNotFoundError):
    """A dataset is not where the config says; the message names the path, the layout
    expected and where the dataset comes from."""


def stratified_split(labels: np.ndarray, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, val) with ``fraction`` of every class (at least one) in val."""
    rng = np.random.default_rng(seed)
    train, val = [], []
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        n_val = max(1, round(fraction * len(idx))) if len(idx) > 1 else 0
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


class WholeSplit(DistributedSampler):
    """Every sample of a split, in order, in every process: the sampler of evaluation loaders.

    Under DDP Lightning would give a validation or test loader a padded DistributedSampler,
    which repeats samples to even out the ranks, and not every task's metric is gathered
    across ranks (BLEU is computed from the rank's own hypotheses). A loader whose sampler is
    already a DistributedSampler is left as it is, so with this one each rank evaluates the
    whole split, every sample once, and gets the single-process value (the DDP cell turns
    off the metrics' cross-rank sync, harness/grid/ddp.py). Outside DDP it is a sequential
    sampler.
    """

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=False)


class SplitDataModule(L.LightningDataModule):
    collate_fn: Callable[[list[Any]], Any] | None = None

    def __init__(self, batch_size: int, num_workers: int, seed: int) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.splits: dict[str, Dataset] = {}

    def loader(self, dataset: Dataset, shuffle: bool = False, order: Sampler | None = None) -> DataLoader:
        """A split's loader: evaluation reads it whole and in order; training (``shuffle``) in the
        cell's seeded random order, or in ``order``, a training sampler of the task's own."""
        training = shuffle or order is not None
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle and order is None,
            sampler=order if order is not None else (None if shuffle else WholeSplit(dataset)),
            # A last partial batch is dropped in training only, and only if it is not the sole one.
            drop_last=training and len(dataset) > self.batch_size,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            generator=torch.Generator().manual_seed(self.seed),
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader(self.splits["train"], shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader(self.splits["val"])

    def test_dataloader(self) -> DataLoader:
        return self.loader(self.splits["test"])


class BuiltSplitsDataModule(SplitDataModule):
    """Splits made by the task's ``make_splits`` on the first ``setup`` (tasks whose splits
    come from one method of their own, so the data module only adds a ``collate_fn``)."""

    def __init__(
        self, make_splits: Callable[[], dict[str, Dataset]], batch_size: int, num_workers: int, seed: int
    ) -> None:
        super().__init__(batch_size, num_workers, seed)
        self.make_splits = make_splits

    def setup(self, stage: str | None = None) -> None:
        if not self.splits:
            self.splits = self.make_splits()


class PatchDataModule(SplitDataModule):
    """Splits of patched inputs (images, clips, event streams), built from the task's data
    config and the patch size; the constructor ``tasks.base.PatchTask`` calls."""

    def __init__(
        self, data: Any, patch: int, batch_size: int, num_workers: int, seed: int, data_root: Path | None
    ) -> None:
        super().__init__(batch_size, num_workers, seed)
        self.data, self.patch, self.data_root = data, patch, data_root
