"""A piece of an eager model run as one compiled function: ``FusedFunction``.

Eager, every operator is a kernel of its own and a pass over its tensors. For an
elementwise chain over large tensors (RoPE's rotation of q and k; CoPE's N x N counts and
their interpolation) those passes are the cost, and compiled alone Inductor makes the
chain a few kernels. Where the whole model is compiled (``trainer.compile``) the chain is
traced into the model's graph instead, so this applies to eager runs only.

Each function has its choice: "auto" (fused on CUDA, eager elsewhere: the CPU's stored
records were trained eagerly and keep their bits), "fused" or "eager". A compilation that
fails under "auto" (no working Triton, say) falls back to the eager form with one warning,
and the process keeps that fallback; under "fused" it raises.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Literal, TypeVar

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from ._flex import raise_recompile_limit

#: Inductor's options for every compilation pe-bench makes (``with_inductor_options``): keep
#: the eager code's 16-bit roundings. By default Inductor keeps a value cast to 16 bits inside a
#: fused kernel in float32, so x - float32(bf16(x)) is 0 there, even where bf16(x) is also
#: stored: PaPE's split of its features into hi + lo 16-bit halves would lose lo, and the
#: float32 product's three bf16 pieces (adapters/_float32_product.py) two of them, silently
#: turning float32-accurate positional logits into 16-bit ones under ``trainer.compile``
#: (tests/harness/test_compile.py: every lo zero with the defaults, eager's bits with this).
#: It also makes other compiled 16-bit arithmetic round where eager rounds. PaPE's pieces no
#: longer rest on it: torch 2.11 dropped them even with it (``_rounding``).
INDUCTOR_OPTIONS = {"emulate_precision_casts": True}


def with_inductor_options(compile_kwargs: dict) -> dict:
    """``torch.compile``'s keyword arguments ``compile_kwargs`` with ``INDUCTOR_OPTIONS`` added
    where Inductor compiles (the default backend) and no ``mode`` or ``options`` are given
    (torch.compile takes one of the two)."""
    if compile_kwargs.get("backend", "inductor") != "inductor" or {"mode", "options"} & compile_kwargs.keys():
        return compile_kwargs
    return {**compile_kwargs, "options": dict(INDUCTOR_OPTIONS)}


KernelChoice = Literal["auto", "fused", "eager"]
KERNEL_CHOICES: tuple[KernelChoice, ...] = ("auto", "fused", "eager")
Result = TypeVar("Result")


class FusedFunction:
    """``function`` compiled (fullgraph), called where ``wanted`` (``__call__``); ``name`` says what it is in
    messages, ``silence`` how a user chooses the eager form, ``recompile_limit`` the compiled
    variants it may hold (one per dtype, layout and grad mode; shapes beyond the first become
    dynamic)."""

    def __init__(self, function: Callable, name: str, silence: str, recompile_limit: int) -> None:
        self.function, self.name, self.silence, self.recompile_limit = function, name, silence, recompile_limit
        self.choice: KernelChoice = "auto"
        #: the compile error that made "auto" give up the fused form in this process (at most one)
        self.failed: list[Exception] = []

    @contextlib.contextmanager
    def chosen(self, choice: KernelChoice) -> Iterator[None]:
        """Run the function as ``choice`` says inside the block."""
        if choice not in KERNEL_CHOICES:
            raise ValueError(f"{self.name}: the choice must be one of {KERNEL_CHOICES}, got {choice!r}")
        previous, self.choice = self.choice, choice
        try:
            yield
        finally:
            self.choice = previous

    @staticmethod
    def auto_on(device: torch.device) -> bool:
        return device.type == "cuda"

    def wanted(self, device: torch.device) -> bool:
        if torch.compiler.is_compiling():
            return False  # traced into a compiled model already
        if is_in_torch_dispatch_mode(include_infra_modes=False):
            # Counting modes (FlopCounterMode, bench's operator, byte and host-wait counters)
            # see every operator eagerly: Dynamo skips compiled frames under them
            return False
        if self.choice == "auto":
            return self.auto_on(device) and not self.failed
        return self.choice == "fused"

    @functools.cached_property
    def compiled(self) -> Callable:
        raise_recompile_limit(self.recompile_limit)
        return torch.compile(self.function, **with_inductor_options({"fullgraph": True}))

    def __call__(self, eager: Callable[[], Result], *args: Tensor | bool | int | None) -> Result:
        """The compiled function on ``args`` (the first a tensor; Python flags and sizes are
        constants of the compiled variant) where it is ``wanted`` on the first argument's
        device; else ``eager()`` (the same result, unfused), also where it does not compile
        under "auto". Errors of running (out of memory, say) are not caught: they would fail
        the eager form too, and a fallback would silently change what a run measures."""
        if not self.wanted(args[0].device):
            return eager()
        try:
            return self.compiled(*args)
        except torch._dynamo.exc.TorchDynamoException as error:
            if self.choice == "fused":
                raise
            warnings.warn(
                f"{self.name} did not compile ({type(error).__name__}: {error}); it runs eagerly"
                f" ({self.silence} silences this)",
                RuntimeWarning,
                stacklevel=3,
            )
            self.failed.append(error)
            return eager()
