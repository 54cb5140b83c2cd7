"""PaPE's and PaPE-RI's widened q and k concatenated by one compiled function
(``pape.widen_heads``, CUDA's default): the same widened heads, layer outputs and gradients
as the eager concatenation, to the bit (concatenating and slicing are exact; the split into
hi + lo stays eager, where Inductor would drop lo).

On CPU "fused" is forced (Inductor's C++ kernels); "auto" keeps the CPU eager, whose stored
records were trained that way."""

from __future__ import annotations

import contextlib

import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, build, pape
from pe_bench.harness.attention import Attention
from pe_bench.harness.conformance.probes import padded_grid

DIM, HEADS = 48, 3  # head width 16
GRID = (4, 5)


def _layer(method: str, options: dict) -> Attention:
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=GRID, num_prefix_tokens=1)
    return Attention(DIM, HEADS, build(method, geometry, DIM, HEADS, depth=1, options=options).make_layer(0))


def _inputs() -> tuple[torch.Tensor, PositionLayout]:
    return padded_grid(GRID, DIM)  # padding in the second sample


def _step(layer: Attention, choice: str, bf16: bool):
    x, layout = _inputs()
    layer.zero_grad()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with pape.FUSED_WIDENING.chosen(choice), autocast:
        out = layer(x, layout) * layout.valid[..., None]
    out.float().square().sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}


CASES = [  # (method, options, bf16 autocast): both encodings, both spaces, the split in bf16
    ("pape", {"m": 4}, False),
    ("pape", {"m": 4, "space": "position"}, True),
    ("pape-ri", {}, True),
]


@pytest.mark.parametrize(("method", "options", "bf16"), CASES)
def test_fused_widening_gives_the_eager_layer(method, options, bf16, fused_calls):
    calls = fused_calls(pape.FUSED_WIDENING)
    layer = _layer(method, options)
    eager_out, eager_grads = _step(layer, "eager", bf16)
    assert not calls
    fused_out, fused_grads = _step(layer, "fused", bf16)
    assert calls, "the fused widening was not used"
    assert torch.equal(fused_out, eager_out)  # the widened heads are the same bits
    assert fused_grads.keys() == eager_grads.keys()
    learned = {f"encoding.{n}" for n, p in layer.encoding.named_parameters() if p.requires_grad}
    assert learned and learned <= fused_grads.keys(), "a positional parameter got no gradient through the fused path"
    for name in eager_grads:
        assert torch.equal(fused_grads[name], eager_grads[name]), name


def test_fused_widening_of_strided_heads_is_bitwise_the_eager_one():
    """The function itself, as the core calls it: q and k strided views of one qkv tensor in
    bf16, float32 features split into hi + lo (lo not zero), padded to a multiple of 8."""
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(2, 7, 3, HEADS, 16, generator=gen).to(torch.bfloat16)
    q, k, _ = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    q_extra, k_extra = torch.randn(2, HEADS, 7, 5, generator=gen), torch.randn(1, HEADS, 7, 5, generator=gen)
    with pape.FUSED_WIDENING.chosen("eager"):
        eager = pape.widen_heads(q, k, q_extra, k_extra, True, 8)
    with pape.FUSED_WIDENING.chosen("fused"):
        fused = pape.widen_heads(q, k, q_extra, k_extra, True, 8)
    assert fused[0].shape == eager[0].shape == (2, HEADS, 7, 32)  # 16 + 3 x 5, padded to 32
    assert eager[0][..., 26:31].count_nonzero() > 0  # q's lo half
    for got, expected in zip(fused, eager, strict=True):
        assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_auto_stays_eager_on_the_cpu(monkeypatch):
    monkeypatch.setattr(pape.FUSED_WIDENING, "compiled", lambda *a: pytest.fail("fused on CPU"))
    _step(_layer("pape", {"m": 4}), "auto", False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["pape", "pape-ri"])
def test_cuda_auto_fuses_and_matches_eager_in_bf16(method, fused_calls):
    calls = fused_calls(pape.FUSED_WIDENING)
    layer = _layer(method, {}).cuda()
    x, layout = _inputs()
    layout = PositionLayout(layout.coords.cuda(), layout.has_pos.cuda(), layout.valid.cuda(), GRID)
    outs = {}
    for choice in ("eager", "auto"):
        with pape.FUSED_WIDENING.chosen(choice), torch.autocast("cuda", dtype=torch.bfloat16):
            outs[choice] = layer(x.cuda(), layout)
    assert calls, "auto did not fuse on CUDA"
    assert torch.equal(outs["auto"], outs["eager"])
