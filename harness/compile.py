"""``trainer.compile``: ``torch.compile`` the model for training and evaluation.

"auto" compiles on CUDA, where fusing the encodings' elementwise work and FlexAttention's
score_mods into kernels pays (issue 16 measured rope 1.40x -> 1.13x and alibi 2.76x ->
1.28x of nopos on an H100), and not on CPU, where compilation costs more than a short
run gains. The model is compiled in place (``nn.Module.compile``), so parameter names,
state dicts and checkpoints are those of the uncompiled model.

Most backbones are compiled whole (one graph per training step, tested). A backbone whose
forward computes tensor sizes from its data (the point backbones: voxel pooling,
serialization and patching) declares ``compiles_per_block = True``; then each of its
transformer blocks is compiled instead, where the encodings and the attention run on
(patches, tokens, dim) tensors, and the index arithmetic between blocks runs eagerly.
Compiled whole, such a model splits into dozens of graphs at those sizes (62-74 for the tiny
point profiles after two steps; 122 for the paper ScanNet PTv3 after two steps and an
evaluation, with 6 code objects past Dynamo's recompile limit, which then run uncompiled
without an error).
"""

from __future__ import annotations

import torch
from torch import nn

from pe_bench.adapters._flex import raise_recompile_limit
from pe_bench.adapters._fused import with_inductor_options

from .blocks import EncoderBlock
from .config import TrainerConfig

#: Dynamo keeps one compiled entry per guard set (a stage's width and heads, training or
#: evaluation, shapes) on the code object all blocks share: the paper ScanNet PTv3 (9 stages)
#: needs more than the default of 8, past which Dynamo would run the remaining blocks
#: uncompiled without an error.
BLOCK_RECOMPILE_LIMIT = 256


def trains_on_cuda(trainer: TrainerConfig) -> bool:
    """Whether ``trainer`` trains on CUDA here (what the "auto" settings resolve by)."""
    return torch.cuda.is_available() and trainer.accelerator in ("auto", "gpu", "cuda")


def compile_enabled(trainer: TrainerConfig) -> bool:
    """``trainer.compile`` resolved: "auto" is on when the run trains on CUDA."""
    if trainer.compile != "auto":
        return trainer.compile
    return trains_on_cuda(trainer)


def compile_regions(model: nn.Module) -> list[nn.Module]:
    """What compiling ``model`` compiles: ``[model]``, or its transformer blocks when one of
    its modules declares ``compiles_per_block`` (data-dependent sizes between the blocks)."""
    if any(getattr(module, "compiles_per_block", False) for module in model.modules()):
        return [module for module in model.modules() if isinstance(module, EncoderBlock)]
    return [model]


def maybe_compile(model: nn.Module, trainer: TrainerConfig, **compile_options) -> nn.Module:
    """Compile ``model`` in place when ``trainer.compile`` says so (``compile_options`` go to
    ``torch.compile``); returns the model.

    The model compiles from a fresh Dynamo state, as in a process of its own: a grid trains
    its cells one after another in one process, every model of a backbone runs the same
    code objects, and Dynamo keeps at most 8 compiled entries per code object (one per
    training or evaluation mode and input shape, for every model compiled before), past
    which it runs the model uncompiled without an error. Measured on this CPU before this
    reset: the third of four ViTs compiled in one process ran eagerly (tests/harness/test_compile.py),
    so a grid's third cell would have trained uncompiled under a record saying compiled."""
    if not compile_enabled(trainer):
        return model
    torch._dynamo.reset()
    return compile_model(model, **compile_options)


def compile_model(model: nn.Module, **compile_options) -> nn.Module:
    """Compile ``model``'s :func:`compile_regions` in place, with Inductor keeping the eager
    code's 16-bit roundings (``_fused.INDUCTOR_OPTIONS``: without it PaPE's float32-accurate
    split and positional bias would silently compile to 16-bit ones); returns the model."""
    regions = compile_regions(model)
    if regions != [model]:
        raise_recompile_limit(BLOCK_RECOMPILE_LIMIT)
    for region in regions:
        region.compile(**with_inductor_options(compile_options))
    return model
