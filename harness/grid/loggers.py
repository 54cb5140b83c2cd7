"""Experiment trackers for a cell (``trainer.logger``): TensorBoard, Weights & Biases, MLflow.

The cell's own ``metrics.csv`` is always written (``EpochLog``); ``csv`` in the list asks for
nothing more. The others are optional packages, installed with the ``tracking`` extra. Each
run is named ``task/method/seedN`` and grouped by grid (the results folder's name):

* tensorboard: event files in ``<cell>/tensorboard/``; ``tensorboard --logdir <out>/runs``
  shows every cell of a grid, named by its folder.
* wandb: offline unless ``WANDB_MODE`` says otherwise (``WANDB_MODE=online`` streams to the
  server; an offline run is uploaded later with ``wandb sync <cell>/wandb/offline-run-*``).
  Group: the grid; project: ``WANDB_PROJECT`` or ``pe-bench``.
* mlflow: ``MLFLOW_TRACKING_URI`` if set, else a local store of the whole grid:
  ``<out>/mlflow.db`` (SQLite; MLflow 3 refuses its old folder store) with artifacts in
  ``<out>/mlartifacts``; one experiment per grid, one run per cell
  (``mlflow ui --backend-store-uri sqlite:///<out>/mlflow.db``). It lives beside the cells
  rather than in each one, so the runs of a grid can be compared side by side, and its
  absolute paths survive a cell being moved from its staging folder into place.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from ..config import ConfigError

EXTRA = "tracking"
#: tracker -> the modules it needs (MLflow's SQLite store needs SQLAlchemy, which mlflow-skinny lacks)
PACKAGES = {"tensorboard": ("tensorboard",), "wandb": ("wandb",), "mlflow": ("mlflow", "sqlalchemy")}


def require_trackers(names: list[str]) -> None:
    """Fail before any training when a tracker's package is missing, naming the fix."""
    absent = {name: [m for m in PACKAGES.get(name, ()) if importlib.util.find_spec(m) is None] for name in names}
    missing = [name for name, modules in absent.items() if modules]
    if missing:
        packages = " ".join(m for name in missing for m in absent[name])
        raise ConfigError(
            f"trainer.logger: {', '.join(missing)} needs the '{EXTRA}' extra: "
            f"pip install 'pe-bench[{EXTRA}]' (or pip install {packages})"
        )


def make_loggers(names: list[str], workdir: Path, run_name: str, grid: Path | None) -> list[Any]:
    """Lightning loggers for ``names``; an empty list when only ``csv`` is asked for."""
    require_trackers(names)
    group = Path(grid).resolve().name if grid is not None else None
    loggers: list[Any] = []
    if "tensorboard" in names:
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(workdir, name="tensorboard", version="", default_hp_metric=False))
    if "wandb" in names:
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(
            WandbLogger(
                name=run_name,
                group=group,
                project=os.environ.get("WANDB_PROJECT", "pe-bench"),
                save_dir=str(workdir),
                offline=os.environ.get("WANDB_MODE", "offline") == "offline",
            )
        )
    if "mlflow" in names:
        from lightning.pytorch.loggers import MLFlowLogger

        home = Path(grid if grid is not None else workdir).resolve()
        home.mkdir(parents=True, exist_ok=True)
        loggers.append(
            MLFlowLogger(
                experiment_name=group or "pe-bench",
                run_name=run_name,
                tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}",
                artifact_location=(home / "mlartifacts").as_uri(),
            )
        )
    return loggers


def close_loggers(loggers: list[Any]) -> None:
    """End each tracker's run: the next cell in this process must start a run of its own
    (Lightning leaves a W&B run open after ``fit`` and ``test``)."""
    from lightning.pytorch.loggers import WandbLogger

    if any(isinstance(logger, WandbLogger) for logger in loggers):
        import wandb

        wandb.finish()  # a no-op when no run was started
