"""What a task is, and the name -> task registry with lm-eval-style groups.

A task = data (tiny generator + real-format loader) + backbone wiring + head + loss +
metric + profiles. Tasks are named after the datasets of the papers' tables; the profile
sets the scale (``tiny``: a small stand-in needing no download; ``paper``: the real data).
"""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
from pydantic import ValidationError
from torch import nn

from pe_bench.adapters import Geometry
from pe_bench.harness.config import (
    ConfigError,
    ModelConfig,
    RunConfig,
    Strict,
    format_validation_error,
    register_model_config,
)
from pe_bench.harness.data import PatchDataModule


class Task(ABC):
    name: ClassVar[str] = ""
    metric: ClassVar[str] = "acc"  # key logged as val/<metric> and test/<metric>
    metric_label: ClassVar[str] = "Acc. (%)"  # table header under the task name
    higher_is_better: ClassVar[bool] = True
    score_scale: ClassVar[float] = 100.0  # logged metric x scale = table units (fraction -> %)
    profiles: ClassVar[tuple[str, ...]] = ("tiny", "paper")
    DataConfig: ClassVar[type[Strict]] = Strict
    #: the ``model`` section's type (a subclass where the backbone needs more, e.g. PTv3's stages)
    ModelConfig: ClassVar[type[ModelConfig]] = ModelConfig
    #: what the tiny profile substitutes for the real dataset (table footnote)
    tiny_standin: ClassVar[str] = ""

    def __init__(self, config: RunConfig, data_root: Path | None = None) -> None:
        if not isinstance(config.model, self.ModelConfig):
            raise ConfigError(
                f"{config.task}/{config.profile}: model is a {type(config.model).__name__}, {self.name} needs a "
                f"{self.ModelConfig.__name__}: build the config with load_run_config once the task is registered"
            )
        self.config = config
        self.data_root = data_root
        try:
            self.data = self.DataConfig(**config.data)
        except ValidationError as err:
            where = f"{config.task}/{config.profile}: data"
            raise ConfigError(format_validation_error(where, err)) from None

    @abstractmethod
    def geometry(self) -> Geometry:
        """Positions the backbone hands to the encoding (decides n/a cells)."""

    @abstractmethod
    def build_model(self, method: str, options: dict[str, Any]) -> nn.Module: ...

    @abstractmethod
    def datamodule(self, seed: int) -> L.LightningDataModule: ...

    @abstractmethod
    def lightning_module(self, model: nn.Module) -> L.LightningModule: ...

    @classmethod
    def benchmark(cls, device: str = "cpu") -> str | None:
        """Task-specific figures for ``pe-bench bench --task NAME`` (e.g. tokenizer events/s,
        backbone time at 10k/100k points) as Markdown; None when the task has none."""
        return None

    def check_data(self) -> None:  # noqa: B027  (optional hook: tasks with real data override it)
        """Fail fast, before any training, when the dataset is missing or malformed."""


class PatchTask(Task):
    """A task whose input is cut into patches (images, clips, event streams): its data module
    is built from the data config and the patch size, and it trains a plain classifier."""

    DataModule: ClassVar[type[PatchDataModule]]

    def datamodule(self, seed: int) -> L.LightningDataModule:
        model, optim, trainer = self.config.model, self.config.optim, self.config.trainer
        return self.DataModule(self.data, model.patch_size, optim.batch_size, trainer.num_workers, seed, self.data_root)

    def lightning_module(self, model: nn.Module) -> L.LightningModule:
        from pe_bench.harness.module import ClassificationModule

        return ClassificationModule(model, self.data.num_classes, self.config.optim)


_TASKS: dict[str, type[Task]] = {}

# Tasks of the papers' tables that pe-bench names but has not implemented yet; a group run
# skips and lists them.
PLANNED = (
    "imagenet", "coco", "scannet", "modelnet40", "ucf101", "dvsgesture", "gen1", "nuscenes",
    "cifar10", "cifar100", "wsj", "tedlium", "wmt14-en-de", "wmt14-en-fr",
)  # fmt: skip

PAPE_TABLE1 = ("imagenet", "coco", "scannet", "modelnet40", "ucf101", "dvsgesture", "gen1", "nuscenes")
GROUPS: dict[str, tuple[str, ...]] = {
    "all": (*PAPE_TABLE1, "wsj", "wmt14-en-de"),
    "pape-table1": PAPE_TABLE1,
    "cape": ("imagenet", "wsj", "tedlium", "wmt14-en-de", "wmt14-en-fr"),
    "sape2": ("cifar10", "cifar100"),
    "wepe": ("cifar100", "imagenet"),
    "string": ("imagenet",),
}


def register_task(cls: type[Task]) -> type[Task]:
    _TASKS[cls.name] = cls
    register_model_config(cls.name, cls.ModelConfig)
    return cls


def implemented() -> list[str]:
    return sorted(_TASKS)


def get_task(name: str) -> type[Task]:
    if name in _TASKS:
        return _TASKS[name]
    if name in PLANNED:
        raise KeyError(f"task {name!r} is not implemented yet; implemented: {', '.join(implemented())}")
    known = sorted({*PLANNED, *_TASKS, *GROUPS})
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise KeyError(f"unknown task or group {name!r}.{hint} Tasks: {', '.join(known)}")


def resolve_tasks(spec: str, warn: Callable[[str], None] = print) -> list[str]:
    """``imagenet,cifar10`` or a group name -> implemented task names (unimplemented ones of a
    group are skipped with a message; an explicitly named unimplemented task is an error)."""
    names: list[str] = []
    skipped: list[str] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item in GROUPS:
            for name in GROUPS[item]:
                (names if name in _TASKS else skipped).append(name)
        else:
            get_task(item)
            names.append(item)
    if skipped:
        warn(f"skipping tasks not implemented yet: {', '.join(dict.fromkeys(skipped))}")
    return list(dict.fromkeys(names))
