"""``trainer.compile``: ``torch.compile`` the model for training and evaluation.

"auto" compiles on CUDA, where fusing the encodings' elementwise work and FlexAttention's
score_mods into kernels pays (issue 16 measured rope 1.40x -> 1.13x and alibi 2.76x ->
1.28x of nopos on an H100), and not on CPU, where compilation costs more than a short
run gains. The model is compiled in place (``nn.Module.compile``), so parameter names,
state dicts and checkpoints are those of the uncompiled model.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import TrainerConfig


def compile_enabled(trainer: TrainerConfig) -> bool:
    """``trainer.compile`` resolved: "auto" is on when the run trains on CUDA."""
    if trainer.compile != "auto":
        return trainer.compile
    return torch.cuda.is_available() and trainer.accelerator in ("auto", "gpu", "cuda")


def maybe_compile(model: nn.Module, trainer: TrainerConfig, **compile_options) -> nn.Module:
    """Compile ``model`` in place when ``trainer.compile`` says so (``compile_options`` go to
    ``torch.compile``); returns the model."""
    if compile_enabled(trainer):
        model.compile(**compile_options)
    return model
