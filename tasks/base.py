"""What a task is, and the name -> task registry with lm-eval-style groups.

A task = data (tiny generator + real-format loader) + backbone wiring + head + loss +
metric + profiles. Tasks are named after the datasets of the papers' tables; the profile
sets the scale (``tiny``: a small stand-in needing no download; ``paper``: the real data).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import pandas as pd
from pydantic import ValidationError
from torch import nn

from pe_bench.adapters import EncodingFactory, Geometry
from pe_bench.harness.config import (
    ConfigError,
    ModelConfig,
    RunConfig,
    Strict,
    builtin_task_implementations,
    format_validation_error,
    load_groups,
    register_model_config,
    register_task_yaml,
)
from pe_bench.harness.data import PatchDataModule
from pe_bench.registry import Registry, UnknownNameError

from ._shared.data_checks import DataReport


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
    #: the YAML with this task's profiles; None for built-ins (``configs/tasks/<name>.yaml``).
    #: A plug-in task sets it to a file in its own package.
    config_file: ClassVar[str | Path | None] = None
    #: whether the task's loss reads ``optim.label_smoothing`` (a cross-entropy over classes or
    #: tokens); False (CTC, detection, segmentation losses) makes a nonzero value an error.
    label_smoothing_applies: ClassVar[bool] = True

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
        if config.optim.label_smoothing and not self.label_smoothing_applies:
            # stored in config.yaml, it would read as a setting the cell trained with
            raise ConfigError(
                f"{config.task}/{config.profile}: optim.label_smoothing is {config.optim.label_smoothing}, but "
                f"{self.name}'s loss has no label smoothing: set it to 0"
            )

    @abstractmethod
    def geometry(self) -> Geometry:
        """Positions the backbone hands to the encoding: the one source of the task's geometry
        (the backbone is built for it, and it decides n/a cells)."""

    @abstractmethod
    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        """The model (backbone + head); its attention stacks get their encodings from
        ``make_encoding(geometry, dim, num_heads, depth)``."""

    @abstractmethod
    def datamodule(self, seed: int) -> L.LightningDataModule: ...

    @abstractmethod
    def lightning_module(self, model: nn.Module) -> L.LightningModule: ...

    def class_names(self) -> list[str] | None:
        """The names of the classes a classifier's outputs stand for, in output order (shown
        by ``pe-bench confusion``); None (the default) where the task has none to give."""
        return None

    def data_fingerprint(self) -> dict[str, str | None]:
        """What decides this cell's data or metric beyond its configuration, after training:
        versions of the packages or programs that generated its corpus, tokenizer or score
        (the tiny translation corpus is built from Babel's and num2words' tables). Stored as
        ``effective.data`` in the cell's config.yaml, so a column mixing cells made from
        different data is marked in the tables (a package not installed: None). Empty (the
        default) when the configuration and pe-bench's own code decide everything."""
        return {}

    @classmethod
    def benchmark(cls, device: str = "cpu", compile: bool = False) -> str | None:
        """Task-specific figures for ``pe-bench bench --task NAME`` (e.g. tokenizer events/s,
        backbone time at 10k/100k points) as Markdown; None when the task has none.
        ``compile`` (``--compile``): add how the task's model does under ``trainer.compile``."""
        return None

    @classmethod
    def extra_tables(cls, records: list[Any]) -> dict[str, pd.DataFrame]:
        """Tables beyond the result matrix, from finished cells (objects with ``task``,
        ``method``, ``seed``, ``score``, ``extra``) of every task: name -> numbers. The
        application writes each as ``<out>/<name>.md`` and ``.csv`` (a ``X_mean``/``X_std``
        column pair is rendered as "mean ± std" under ``X``). Speech: WER per duration bin."""
        return {}

    def check_data(self, full: bool = False, workers: int = 1) -> DataReport:
        """Fail fast, before any training, when the dataset is missing or malformed.

        The quick check (``full=False``, run before every grid and cell) looks at the layout,
        the lists and the class names, never at every sample. ``full=True`` (``pe-bench
        check-data``) also opens every file in ``workers`` processes and returns every broken
        one in the report instead of stopping at the first. Tasks with real data override it;
        a layout or class-list problem raises in both modes.
        """
        return DataReport(self.name, notes=["no dataset on disk for this profile (generated data)"])


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


ENTRY_POINT_GROUP = "pe_bench.tasks"


def _declare_config(name: str, cls: type[Task]) -> None:
    cls.name = name
    register_model_config(name, cls.ModelConfig)
    if cls.config_file is not None:  # a plug-in task brings its own YAML profiles
        register_task_yaml(name, Path(cls.config_file))


#: Every task: the built-ins declared by ``configs/tasks/<name>.yaml`` (``implementation:
#: module:Class``, imported on first use) and plug-ins from the ``pe_bench.tasks`` entry-point
#: group, which name a Task subclass with its own ``config_file``.
TASKS: Registry[type[Task]] = Registry("task", Task, ENTRY_POINT_GROUP, on_register=_declare_config)
for _name, _target in builtin_task_implementations().items():
    TASKS.add_lazy(_name, _target, origin=f"configs/tasks/{_name}.yaml")


def groups() -> dict[str, list[str]]:
    """``configs/groups.yaml``: group name -> task names (some may not be implemented yet)."""
    return load_groups()


def implemented() -> list[str]:
    return TASKS.names()


def planned() -> list[str]:
    """Tasks named in groups that have no implementation yet, in the order groups name them."""
    named = [task for members in groups().values() for task in members]
    return [task for task in dict.fromkeys(named) if task not in TASKS]


def get_task(name: str) -> type[Task]:
    if name in TASKS:
        return TASKS.get(name)
    if name in planned():
        raise UnknownNameError(f"task {name!r} is not implemented yet; implemented: {', '.join(implemented())}")
    raise UnknownNameError(TASKS.unknown_message(name, extra_names=[*groups(), *planned()]))


def resolve_tasks(spec: str, warn: Callable[[str], None] = print) -> list[str]:
    """``imagenet,cifar10`` or a group name -> implemented task names (unimplemented ones of a
    group are skipped with a message; an explicitly named unimplemented task is an error)."""
    names: list[str] = []
    skipped: list[str] = []
    declared = groups()
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item in declared:
            for name in declared[item]:
                (names if name in TASKS else skipped).append(name)
        else:
            get_task(item)
            names.append(item)
    if skipped:
        warn(f"skipping tasks not implemented yet: {', '.join(dict.fromkeys(skipped))}")
    if not names:
        raise UnknownNameError(f"--tasks {spec!r} selects no task; tasks: {', '.join(implemented())}")
    return list(dict.fromkeys(names))
