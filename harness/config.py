"""Typed run configuration: YAML profiles validated by pydantic.

A bad key or value is an error that names the key (pydantic's ``loc``), e.g.
``imagenet/tiny: optim.lr: Input should be a valid number``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(Strict):
    dim: int
    depth: int
    num_heads: int
    mlp_ratio: float = 4.0
    patch_size: int = 16
    drop_path: float = 0.0
    dropout: float = 0.0
    # PaPE Appendix E: zero head weights and bias -log(C) give uniform initial predictions.
    head_init: Literal["zero", "default"] = "zero"


class OptimConfig(Strict):
    optimizer: Literal["adamw", "adam"] = "adamw"
    lr: float
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_epochs: float = 0.0
    epochs: int
    batch_size: int
    label_smoothing: float = 0.0
    grad_clip: float | None = None


class TrainerConfig(Strict):
    """Passed to ``lightning.Trainer``: DDP on many GPUs/nodes is a config change only."""

    accelerator: str = "auto"
    devices: int | str | list[int] = "auto"
    strategy: str = "auto"
    num_nodes: int = 1
    # "auto": bf16-mixed on CUDA, 32-true on CPU (PaPE trains in 16-bit mixed precision).
    precision: str = "auto"
    num_workers: int = 0
    max_time: str | None = None  # "DD:HH:MM:SS" wall-clock cap per cell
    # CPU threads for torch (None: torch's default, or OMP_NUM_THREADS). On a busy machine 1
    # thread per process avoids oversubscription, which made steps 8-14x slower here.
    threads: int | None = Field(default=None, ge=1)
    # torch.compile the model (harness/compile.py); "auto": on for CUDA, off on CPU.
    compile: bool | Literal["auto"] = "auto"


class RunConfig(Strict):
    """One task at one profile. ``data`` is validated by the task's own model."""

    task: str
    profile: str
    model: ModelConfig
    optim: OptimConfig
    trainer: TrainerConfig = TrainerConfig()
    data: dict[str, Any] = {}
    # per-method encoding options for this task, e.g. {"cape": {"freq_scale": 30}}
    methods: dict[str, dict[str, Any]] = {}


class ConfigError(ValueError):
    pass


def format_validation_error(where: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        lines.append(f"{where}: {key}: {e['msg']}")
    return "\n".join(lines)


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {key} is not a section")
    node[keys[-1]] = value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["optim.epochs=2", "model.dim=32"]`` -> nested dict; values parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects KEY=VALUE, got {pair!r}")
        key, raw = pair.split("=", 1)
        set_dotted(tree, key.strip(), yaml.safe_load(raw))
    return tree


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


_PLUGIN_TASK_YAML: dict[str, Path] = {}


def register_task_yaml(task: str, path: Path) -> None:
    """Where a plug-in task's profiles are (built-ins live in ``configs/tasks/``)."""
    _PLUGIN_TASK_YAML[task] = path


def _builtin_task_files() -> dict[str, Any]:
    folder = resources.files("pe_bench.configs").joinpath("tasks")
    return {p.name.removesuffix(".yaml"): p for p in folder.iterdir() if p.name.endswith(".yaml")}


def task_yaml(task: str) -> dict[str, Any]:
    path = _PLUGIN_TASK_YAML.get(task) or _builtin_task_files().get(task)
    if path is None:
        raise ConfigError(f"task {task!r} has no configuration file (configs/tasks/{task}.yaml)")
    return yaml.safe_load(path.read_text())


def builtin_task_implementations() -> dict[str, str]:
    """Task name -> ``module:Class`` from the ``implementation:`` key of every task YAML."""
    return {name: yaml.safe_load(path.read_text())["implementation"] for name, path in _builtin_task_files().items()}


def load_groups() -> dict[str, list[str]]:
    text = resources.files("pe_bench.configs").joinpath("groups.yaml").read_text()
    return {name: list(members) for name, members in yaml.safe_load(text).items()}


class StudySpec(Strict):
    """A ready-made grid (e.g. PaPE's ablation tables): tasks, methods, config overrides per profile."""

    description: str
    tasks: list[str]
    methods: list[str]
    overrides: dict[str, dict[str, Any]] = {}  # profile -> overrides, e.g. {"paper": {"optim": {...}}}


def studies() -> list[str]:
    folder = resources.files("pe_bench.configs").joinpath("studies")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_study(name: str) -> StudySpec:
    if name not in studies():
        raise ConfigError(f"unknown study {name!r}; studies: {', '.join(studies())}")
    text = resources.files("pe_bench.configs").joinpath("studies", f"{name}.yaml").read_text()
    try:
        return StudySpec(**yaml.safe_load(text))
    except ValidationError as err:
        raise ConfigError(format_validation_error(f"study {name}", err)) from None


def load_run_config(task: str, profile: str, overrides: dict[str, Any] | None = None) -> RunConfig:
    spec = task_yaml(task)
    profiles = spec.get("profiles", {})
    if profile not in profiles:
        raise ConfigError(f"task {task!r} has no profile {profile!r}; profiles: {', '.join(profiles)}")
    raw = deep_merge(spec.get("defaults", {}), profiles[profile])
    raw = deep_merge(raw, overrides or {})
    raw.update(task=task, profile=profile)
    try:
        return RunConfig(**raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(f"{task}/{profile}", err)) from None
