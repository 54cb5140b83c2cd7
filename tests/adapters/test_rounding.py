"""``_rounding.rounded_pieces``: a float32 tensor cut into 16-bit pieces, eagerly by casts and
compiled by an operator Inductor cannot fuse the roundings out of.

Compiled with Inductor's *default* options below, on purpose: those fold x - bf16(x) to 0
inside a fused kernel in every torch release (test_compile.py shows it on raw casts), as
torch 2.11 also did with pe-bench's ``emulate_precision_casts`` once the pieces fused with
PaPE's concatenation. The compiled pieces must be eager's bits whatever the options."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import pape
from pe_bench.adapters._float32_product import pieces
from pe_bench.adapters._rounding import rounded_pieces


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pieces_are_the_casts_and_keep_eight_more_bits_each(dtype):
    x = _x(64, 33)
    hi, lo = rounded_pieces(x, dtype, 2)
    assert torch.equal(hi, x.to(dtype)) and torch.equal(lo, (x - x.to(dtype).float()).to(dtype))
    assert lo.count_nonzero() > 0
    one, two, three = pieces(x)
    error_of = lambda *ps: (sum(p.double() for p in ps) - x.double()).abs().max().item()  # noqa: E731
    # each bf16 piece carries 8 bits: |x| < 2^4 here, so the sums' errors fall below 2^4 * 2^-8k
    assert error_of(one) <= 2**-4 and error_of(one, two) <= 2**-12 and error_of(one, two, three) <= 2**-20
    assert error_of(one, two, three) < error_of(one, two) < error_of(one)


def _widened(q: torch.Tensor, x: torch.Tensor):
    """PaPE's pattern: the pieces concatenated onto a 16-bit head, in one fusable graph."""
    return torch.cat([q, *rounded_pieces(x, q.dtype, 3)], dim=-1)


def test_compiled_pieces_are_eager_bits_and_pass_the_gradient_through_the_first():
    """Forward: the pieces fused with a concatenation (where torch 2.11 lost them), of a
    strided input. Backward: the gradient reaches x through the first piece only, eager and
    compiled (up to the 16-bit rounding of the gradient, which Inductor's defaults skip)."""
    q = _x(2, 7, 8, seed=1).to(torch.bfloat16)
    x = _x(2, 7, 7, seed=2).transpose(1, 2)  # strided, as a head's features often are
    weights = _x(2, 7, 8 + 3 * 7, seed=3)

    def step(function):
        leaf = x.detach().requires_grad_()
        out = function(q, leaf)
        (out.float() * weights).sum().backward()
        return out.detach(), leaf.grad

    eager_out, eager_grad = step(_widened)
    assert eager_out[..., 22:].count_nonzero() > 0  # lo is there to lose
    torch._dynamo.reset()
    compiled_out, compiled_grad = step(torch.compile(_widened, fullgraph=True))
    assert torch.equal(compiled_out, eager_out)
    through_the_first = weights[..., 8:15]
    assert torch.equal(eager_grad, through_the_first.to(torch.bfloat16).float())
    torch.testing.assert_close(compiled_grad, through_the_first, rtol=2**-8, atol=0)


def test_compiled_widening_keeps_the_lo_halves():
    """``pape.widen_heads`` itself with the split, compiled with Inductor's defaults, is eager's
    widened q and k to the bit: the lo halves (q's columns 26..30) are not zero."""
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 3, 7, 16, generator=gen).to(torch.bfloat16) for _ in range(2))
    q_extra, k_extra = torch.randn(2, 3, 7, 5, generator=gen), torch.randn(1, 3, 7, 5, generator=gen)
    with pape.FUSED_WIDENING.chosen("eager"):
        eager = pape.widen_heads(q, k, q_extra, k_extra, True, 8)
        torch._dynamo.reset()
        compiled = torch.compile(pape.widen_heads, fullgraph=True)(q, k, q_extra, k_extra, True, 8)
    assert eager[0][..., 26:31].count_nonzero() > 0
    for got, expected in zip(compiled, eager, strict=True):
        assert torch.equal(got, expected)


def test_the_operator_returns_fresh_tensors_even_for_input_already_in_the_dtype():
    """A custom operator may not alias its input; ``to`` would return x itself here."""
    x = _x(4, 5).to(torch.bfloat16)
    first, second = torch.ops.pe_bench.rounded_pieces(x, torch.bfloat16, 2)
    assert torch.equal(first, x) and first.data_ptr() != x.data_ptr()
    assert second.count_nonzero() == 0
    torch.library.opcheck(torch.ops.pe_bench.rounded_pieces, (_x(3, 4).requires_grad_(), torch.bfloat16, 3))
