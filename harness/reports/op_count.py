"""Operators a model dispatches per forward and per training step: a count that does not
depend on the machine's speed or noise.

Issue 16 found eager GPU steps of small batches dominated by per-operator overhead (each
operator is at least one kernel launch and a pass through the dispatcher), so the count of
operators is the CPU-measurable figure behind that cost. Views (reshapes, transposes,
slices: metadata only, no kernel) are left out.
"""

from __future__ import annotations

from collections import Counter
from typing import TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that the dispatcher reports as non-views but that only rewrite metadata.
_METADATA_ONLY = {torch.ops.aten._unsafe_view.default}


def _launches_work(func: torch._ops.OpOverload) -> bool:
    """True for operators that compute (a kernel), False for views and non-tensor helpers
    (``promote_types``), which the dispatcher also reports."""
    if func.is_view or func in _METADATA_ONLY:
        return False
    return any("Tensor" in str(ret.type) for ret in func._schema.returns)


class OperatorCounter(TorchDispatchMode):
    """Counts the computing operators dispatched inside the block, by name (``counts``), and
    the bytes their outputs take (``written``, by name): every computing operator writes its
    outputs once, so at large batches, where an eager step's elementwise work is bound by
    memory bandwidth, bytes written is the machine-independent figure behind its time."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.written: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _launches_work(func):
            name = str(func.overloadpacket)
            self.counts[name] += 1
            outputs = out if isinstance(out, tuple | list) else (out,)
            self.written[name] += sum(t.numel() * t.element_size() for t in outputs if isinstance(t, torch.Tensor))
        return out

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def total_written(self) -> int:
        return sum(self.written.values())


def operators_per_pass(
    model: torch.nn.Module, inputs: torch.Tensor, autocast_dtype: torch.dtype | None = None
) -> tuple[int, int]:
    """Computing operators of one inference forward and of one training forward + backward
    (loss on the summed outputs; no optimiser step) of ``model`` on ``inputs``, the forwards
    under autocast to ``autocast_dtype`` (None: none)."""
    with torch.inference_mode(), OperatorCounter() as forward, _autocast(inputs, autocast_dtype):
        model.eval()(inputs)
    return forward.total, training_step_under(OperatorCounter(), model, inputs, autocast_dtype).total


def bytes_written_per_step(
    model: torch.nn.Module, inputs: torch.Tensor, autocast_dtype: torch.dtype | None = None
) -> int:
    """Bytes the computing operators of one training forward + backward of ``model`` on
    ``inputs`` write (loss on the summed outputs; no optimiser step), the forward under
    autocast to ``autocast_dtype`` (None: none)."""
    return training_step_under(OperatorCounter(), model, inputs, autocast_dtype).total_written


def _autocast(inputs: torch.Tensor, dtype: torch.dtype | None):
    return torch.autocast(inputs.device.type, dtype=dtype, enabled=dtype is not None)


Mode = TypeVar("Mode", bound=TorchDispatchMode)


def training_step_under(
    mode: Mode, model: torch.nn.Module, inputs: torch.Tensor, autocast_dtype: torch.dtype | None = None
) -> Mode:
    """One training forward + backward (loss on the summed outputs) under the dispatch mode
    ``mode`` (a counter); the gradients are dropped afterwards. The backward runs outside
    autocast, as a mixed-precision trainer runs it (Lightning's bf16-mixed): inside, autocast
    would also cast the backward's own float32 products (a weight computed in float32 in the
    forward, as STRING's folded basis is) to 16 bits, operators and bytes a real step does
    not have."""
    model.train()
    with mode:
        with _autocast(inputs, autocast_dtype):
            loss = model(inputs).float().sum()
        loss.backward()
    model.zero_grad(set_to_none=True)
    return mode
