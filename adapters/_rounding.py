"""A float32 number cut into 16-bit pieces, compiled or not: ``rounded_pieces``.

PaPE's split (each widened feature f = hi + lo in 16 bits) and its positional bias's float32
product (each feature x = hi + mid + lo in bf16) rest on one identity: hi is x rounded to 16
bits, so x - hi is exact in float32 and is what the next piece rounds. Eager kernels round at
every cast. A compiler that fuses the cast into the subtraction may keep hi at float32 inside
the kernel, and x - hi is then 0: the lo pieces vanish and the parabola's cancellation is back
in 16 bits, with nothing to show for it but worse logits.

Inductor does that with its default options, and pe-bench compiles with
``emulate_precision_casts`` (``_fused.INDUCTOR_OPTIONS``) to keep eager's roundings. That
option is not enough in every torch release: with torch 2.11 (the GPU machines' torch),
compiled by Inductor's CPU backend, a split whose pieces fuse with the concatenation that
widens the heads lost its lo halves even with the option (measured, stop 60: a compiled PaPE
layer in bf16 autocast at a 16 x 16 grid was 0.0188 off float64 against eager's 0.0015; the
same code under torch 2.14 kept eager's bits). So under ``torch.compile`` the pieces are cut
by one custom operator, which the compiler calls and cannot fuse into, rather than by casts
it may rewrite; eagerly by the same casts, operator for operator, as before.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def rounded_pieces(x: Tensor, dtype: torch.dtype, count: int) -> list[Tensor]:
    """x as ``count`` pieces in ``dtype``: p0 = dtype(x), p1 = dtype(x - p0),
    p2 = dtype(x - p0 - p1), ..., each difference exact in x's dtype (float32 for 16-bit
    pieces), so that p0 + p1 + ... keeps 8 more bits of x per bf16 piece. The gradient passes
    through p0 alone (rounding taken as the identity: the later pieces' derivatives in x are
    1 - 1 = 0, which autograd would form as sums of +g and -g)."""
    if torch.compiler.is_compiling():
        return torch.ops.pe_bench.rounded_pieces(x, dtype, count)
    return _cut(x, count, lambda t: t.to(dtype))


def _cut(x: Tensor, count: int, rounded: Callable[[Tensor], Tensor]) -> list[Tensor]:
    """``count`` pieces of x, each the ``rounded`` rest: eagerly by casts, in the operator
    below by copies. Only the first piece keeps x's gradient."""
    pieces, rest = [rounded(x)], x.detach()
    for _ in range(count - 1):
        # rest - piece promotes the 16-bit piece inside the subtraction, exactly
        rest = rest - pieces[-1].detach()
        pieces.append(rounded(rest))
    return pieces


@torch.library.custom_op("pe_bench::rounded_pieces", mutates_args=())
def _rounded_pieces_op(x: Tensor, dtype: torch.dtype, count: int) -> list[Tensor]:
    # each piece rounded by copying into a fresh tensor laid out as ``empty_like`` lays it
    # out (the fake below): a custom operator may not return its input (``to`` would, for x
    # already in ``dtype``), and the compiler plans its buffers on the fake's strides; the
    # copy rounds as ``to`` does, so the pieces are the eager casts'
    return _cut(x.detach(), count, lambda t: torch.empty_like(x, dtype=dtype).copy_(t))


@_rounded_pieces_op.register_fake
def _(x: Tensor, dtype: torch.dtype, count: int) -> list[Tensor]:
    return [torch.empty_like(x, dtype=dtype) for _ in range(count)]


def _remember_dtype(ctx, inputs: tuple, output: list[Tensor]) -> None:
    ctx.dtype = inputs[0].dtype


def _through_the_first_piece(ctx, grads: list[Tensor | None]) -> tuple[Tensor | None, None, None]:
    first = grads[0]
    return (None if first is None else first.to(ctx.dtype)), None, None


_rounded_pieces_op.register_autograd(_through_the_first_piece, setup_context=_remember_dtype)
