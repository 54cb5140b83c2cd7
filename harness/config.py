"""Typed run configuration: YAML profiles validated by pydantic.

A bad key or value is an error that names the key (pydantic's ``loc``), e.g.
``imagenet/tiny: optim.lr: Input should be a valid number``.
"""

from __future__ import annotations

import importlib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(Strict):
    """What every backbone has. A task whose backbone needs more (e.g. PTv3's stage structure)
    subclasses it as its ``Task.ModelConfig``; that task's ``model`` section is validated with
    the subclass (see :func:`register_model_config`)."""

    dim: int = Field(ge=1)
    depth: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    mlp_ratio: float = Field(4.0, gt=0.0)
    patch_size: int = Field(16, ge=1)
    drop_path: float = Field(0.0, ge=0.0, lt=1.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # PaPE Appendix E: zero head weights and bias -log(C) give uniform initial predictions.
    head_init: Literal["zero", "default"] = "zero"
    # True: the encoding draws its random initial values from a stream of its own, so at one seed
    # every encoding's backbone starts from the same weights (a paired comparison; see
    # adapters/init_stream.py). False, the default of every shipped record: one global stream,
    # so an encoding that draws (RoPE-Mixed, PaPE, abspos, ...) changes every later weight.
    paired_init: bool = False

    @model_validator(mode="after")
    def _heads_split_the_width(self) -> ModelConfig:
        # Attention splits dim into num_heads equal heads; otherwise every cell fails in reshape.
        if self.dim % self.num_heads:
            raise ValueError(f"model.dim={self.dim} is not divisible by model.num_heads={self.num_heads}")
        return self


_TASK_MODEL_CONFIGS: dict[str, type[ModelConfig]] = {}


def register_model_config(task: str, config: type[ModelConfig]) -> None:
    """Validate the ``model`` section of ``task``'s run configs with ``config`` (``register_task``
    calls it with the task's ``ModelConfig``)."""
    _TASK_MODEL_CONFIGS[task] = config


def model_config_for(task: str) -> type[ModelConfig]:
    if task not in _TASK_MODEL_CONFIGS:
        # A built-in task is imported on first use: its YAML names the class, whose
        # ``ModelConfig`` validates the model section.
        target = task_yaml(task).get("implementation") if task in _builtin_task_files() else None
        if target:
            module, _, name = target.partition(":")
            config = getattr(getattr(importlib.import_module(module), name), "ModelConfig", ModelConfig)
            _TASK_MODEL_CONFIGS[task] = config
    return _TASK_MODEL_CONFIGS.get(task, ModelConfig)


class OptimConfig(Strict):
    optimizer: Literal["adamw", "adam"] = "adamw"
    lr: float = Field(gt=0.0)
    weight_decay: float = Field(0.05, ge=0.0)
    betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0)], Annotated[float, Field(ge=0.0, lt=1.0)]] = (0.9, 0.999)
    warmup_epochs: float = Field(0.0, ge=0.0)
    epochs: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    grad_clip: float | None = Field(None, gt=0.0)
    # Learning rate of the position-indexed tables (abspos, relpos, SaPE², CoPE) relative to
    # ``lr`` (see harness/module.py parameter_groups); 1 = the papers' setting.
    table_lr_scale: float = Field(1.0, ge=0.0)
    # The schedule (harness/module.py learning_rate_schedule; README, Schedules). "onecycle":
    # torch's OneCycleLR, the warm-up from lr/25 and the decay to lr/25e4 both cosine-shaped,
    # and with ``cycle_momentum`` (null: true) Adam's beta1 cycled 0.95 -> 0.85 (at the peak
    # lr) -> 0.95 in place of betas[0] (torch's default, which every shipped record trained
    # with: their betas[0] was never used). "warmup_cosine": the official PaPE code's
    # (pape/lr_schedule.py): linear warm-up from 0, half-cosine decay to ``final_lr``, betas
    # constant.
    schedule: Literal["onecycle", "warmup_cosine"] = "onecycle"
    cycle_momentum: bool | None = None  # onecycle only: false keeps beta1 at betas[0]
    final_lr: float = Field(0.0, ge=0.0)  # warmup_cosine only: the lr of the last step

    @model_validator(mode="after")
    def _schedule_keys_apply(self) -> OptimConfig:
        if self.schedule == "warmup_cosine" and self.cycle_momentum:
            raise ValueError("optim.cycle_momentum is onecycle's: warmup_cosine keeps betas constant")
        if self.schedule == "onecycle" and self.final_lr:
            raise ValueError(
                "optim.final_lr applies to schedule warmup_cosine; onecycle decays to lr / 25e4 "
                "(set optim.schedule=warmup_cosine)"
            )
        if self.final_lr > self.lr:
            raise ValueError(f"optim.final_lr {self.final_lr} exceeds optim.lr {self.lr}")
        return self


# What ``lightning.Trainer(precision=...)`` accepts (its full names and short aliases), plus
# "auto". Checked here so that a typo stops the grid instead of failing inside every cell.
Precision = Literal[
    "auto", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true",
    "transformer-engine", "transformer-engine-float16", "64", "32", "16", "bf16",
]  # fmt: skip


class TrainerConfig(Strict):
    """Passed to ``lightning.Trainer``: DDP on many GPUs/nodes is a config change only."""

    accelerator: str = "auto"
    devices: int | str | list[int] = "auto"
    strategy: str = "auto"
    num_nodes: int = Field(1, ge=1)
    # "auto": bf16-mixed on CUDA, 32-true on CPU (PaPE trains in 16-bit mixed precision).
    precision: Precision = "auto"
    num_workers: int = Field(0, ge=0)
    max_time: str | None = None  # "DD:HH:MM:SS" wall-clock cap per cell
    # CPU threads for torch (None: torch's default, or OMP_NUM_THREADS). On a busy machine 1
    # thread per process avoids oversubscription, which made steps 8-14x slower here.
    threads: int | None = Field(default=None, ge=1)
    # Experiment trackers, several at once. The cell's metrics.csv (one row per epoch) is always
    # written: "csv" alone is the default and adds nothing. tensorboard, wandb and mlflow need
    # the ``tracking`` extra (pip install 'pe-bench[tracking]').
    logger: list[Literal["csv", "tensorboard", "wandb", "mlflow"]] = ["csv"]
    # torch.compile the model (harness/compile.py); "auto": on for CUDA, off on CPU.
    compile: bool | Literal["auto"] = "auto"
    # The bias encodings' attention kernel (those with a FlexAttention form: alibi, lookhere,
    # relpos, sape2, pape[form=explicit]; harness/attention.py). "auto": on CUDA FlexAttention
    # (no N x N tensor) where the dense bias would exceed 2^23 elements, SDPA with the dense
    # bias below (ViT-B at 224²: 12 x 197²); on CPU always the dense bias. "dense" or "flex"
    # force one; "flex" trains on CUDA only (FlexAttention has no backward on CPU). Results
    # differ by rounding only.
    attention_kernel: Literal["auto", "flex", "dense"] = "auto"

    @field_validator("precision", mode="before")
    @classmethod
    def _integer_precision(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value  # YAML reads 32 as an int


class RunConfig(Strict):
    """One task at one profile. ``model`` is validated with the task's model config (see
    :func:`register_model_config`), ``data`` by the task's own model."""

    task: str
    profile: str
    # SerializeAsAny: a task's ModelConfig subclass dumps its own fields too (config.yaml).
    model: SerializeAsAny[ModelConfig]
    optim: OptimConfig
    trainer: TrainerConfig = TrainerConfig()
    data: dict[str, Any] = {}
    # per-method encoding options for this task, e.g. {"cape": {"freq_scale": 30}}
    methods: dict[str, dict[str, Any]] = {}

    @field_validator("model", mode="before")
    @classmethod
    def _task_model_config(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, dict):
            return model_config_for(info.data.get("task", "")).model_validate(value)
        return value


#: Typed config keys removed from the code, with the value at which a cell that stored them
#: ran exactly as cells without them do: a stored retired key at that value is no difference
#: (older result folders stay usable); at any other value it is one.
RETIRED_KEYS: dict[str, Any] = {
    # replaced by optim.table_lr_scale (tables only); 1.0 scaled nothing, as the new key's 1.0
    "optim.positional_lr_scale": 1.0,
}


class ConfigError(ValueError):
    pass


def format_validation_error(where: str, err: ValidationError) -> str:
    """One line per problem, ``WHERE: KEY: what is wrong`` (never pydantic's raw text and URL).
    A validator's own message that already names its keys is printed as it is."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        message = str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"]
        if e["type"] not in ("value_error", "missing", "extra_forbidden") and not isinstance(e["input"], dict):
            message += f", got {e['input']!r}"
        if message.split("=", 1)[0].startswith(key) and "=" in message:
            lines.append(f"{where}: {message}")
        else:
            lines.append(f"{where}: {key}: {message}")
    return "\n".join(lines)


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {key} is not a section")
    node[keys[-1]] = value


ALL_TASKS = "all"  # the scope of an override that applies to every task of a grid


def _split_pair(pair: str) -> tuple[str, str, Any]:
    """``"imagenet:optim.lr=1e-3"`` -> ("imagenet", "optim.lr", 0.001); no ``TASK:`` -> scope "all"."""
    if "=" not in pair:
        raise ConfigError(f"--set expects KEY=VALUE or TASK:KEY=VALUE, got {pair!r}")
    key, raw = pair.split("=", 1)
    scope, colon, dotted = key.strip().rpartition(":")  # keys never hold ":", values may
    if colon and not scope.strip():
        raise ConfigError(f"--set {pair!r}: nothing before ':'; write TASK:KEY=VALUE, e.g. imagenet:optim.lr=1e-3")
    if not dotted.strip():
        raise ConfigError(f"--set {pair!r}: no key before '='")
    return scope.strip() or ALL_TASKS, dotted.strip(), yaml.safe_load(raw)


def override_scope(pair: str) -> str:
    """The task a ``--set`` pair is scoped to, or ``"all"``."""
    return _split_pair(pair)[0]


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["optim.epochs=2", "model.dim=32"]`` -> nested dict; values parsed as YAML scalars."""
    scoped = task_overrides(pairs)
    tasks = sorted(set(scoped) - {ALL_TASKS})
    if tasks:
        raise ConfigError(f"parse_overrides takes KEY=VALUE pairs for every task; for {', '.join(tasks)}:KEY=VALUE "
                          "use task_overrides()")
    return scoped.get(ALL_TASKS, {})


def _undotted(tree: dict[str, Any], where: str) -> dict[str, Any]:
    """Nested mappings from a file; a dotted key (``optim.lr: 0.001``) is a path, like in --set."""
    nested: dict[str, Any] = {}
    for key, value in tree.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where}: key {key!r} is not a name")
        branch: dict[str, Any] = {}
        set_dotted(branch, key, _undotted(value, f"{where}.{key}") if isinstance(value, dict) else value)
        nested = deep_merge(nested, branch)
    return nested


def load_override_file(path: Path) -> dict[str, dict[str, Any]]:
    """A YAML file of overrides per scope: task names, or ``all`` for every task::

        all:                     # every task of the grid
          optim: {epochs: 5}
        imagenet:                # this task only (beats ``all``)
          optim: {lr: 1.0e-3}    # 1.0e-3, not 1e-3: YAML 1.1 reads 1e-3 as a string
          data.image_size: 32    # dotted keys work too
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"-c {path}: no such file")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"-c {path}: not valid YAML: {err}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"-c {path}: expected a mapping of task names (or 'all') to overrides, got {tree!r}")
    scoped = {}
    for scope, overrides in tree.items():
        if not isinstance(overrides, dict):
            raise ConfigError(
                f"-c {path}: {scope!r} must map to config keys, e.g. '{scope}: {{optim: {{lr: 1.0e-3}}}}', "
                f"got {overrides!r}"
            )
        scoped[str(scope)] = _undotted(overrides, f"-c {path}: {scope}")
    return scoped


def task_overrides(pairs: list[str], files: list[Path] | tuple[Path, ...] = ()) -> dict[str, dict[str, Any]]:
    """Overrides per scope (``"all"`` or a task name) from config files and ``--set`` pairs.

    Files apply in order, then the pairs, so the command line wins over a file. Which scope
    wins for a task is the caller's choice; the grid puts a task's own scope over ``all``.
    """
    scoped: dict[str, dict[str, Any]] = {}
    for path in files:
        for scope, tree in load_override_file(path).items():
            scoped[scope] = deep_merge(scoped.get(scope, {}), tree)
    for pair in pairs:
        scope, dotted, value = _split_pair(pair)
        set_dotted(scoped.setdefault(scope, {}), dotted, value)
    return scoped


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


def profile_section(task: str, profile: str) -> dict[str, Any]:
    """The task YAML's ``profile`` section (its ``defaults`` merged under it), as the file reads now."""
    spec = task_yaml(task)
    profiles = spec.get("profiles", {})
    if profile not in profiles:
        raise ConfigError(f"task {task!r} has no profile {profile!r}; profiles: {', '.join(profiles)}")
    return deep_merge(spec.get("defaults", {}), profiles[profile])


def load_run_config(
    task: str, profile: str, overrides: dict[str, Any] | None = None, section: dict[str, Any] | None = None
) -> RunConfig:
    """The task's profile with ``overrides`` on top. ``section``: the profile as read earlier
    (``profile_section``), so that a grid's cells keep the YAML they started with."""
    raw = deep_merge(profile_section(task, profile) if section is None else section, overrides or {})
    raw.update(task=task, profile=profile)
    try:
        return RunConfig(**raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(f"{task}/{profile}", err)) from None
