"""CoPE's bias as one compiled function (``cope.FUSED_COPE``, CUDA's default): the same outputs
and gradients as the eager passes, with CLS, padding and causality.

On CPU "fused" is forced (Inductor's C++ kernels); "auto" keeps the CPU eager, whose stored
records were trained that way. The fallback and counting-mode behaviour of the shared
``FusedFunction`` is tested through RoPE's rotation (test_fused_rotation.py)."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, build, cope
from pe_bench.harness.attention import Attention
from pe_bench.harness.conformance.probes import padded_grid

DIM, HEADS = 48, 3  # head width 16
GRID = (4, 5)


def _layer() -> Attention:
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=GRID, num_prefix_tokens=1)
    return Attention(DIM, HEADS, build("cope", geometry, DIM, HEADS, depth=1).make_layer(0))


def _inputs() -> tuple[torch.Tensor, PositionLayout]:
    return padded_grid(GRID, DIM)  # padding in the second sample


def _step(layer: Attention, x: torch.Tensor, layout: PositionLayout, choice: str, causal: bool = False):
    layer.zero_grad()
    with cope.FUSED_COPE.chosen(choice):
        out = layer(x, layout, causal=causal) * layout.valid[..., None]
    out.square().sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_fused_cope_equals_the_eager_passes(causal, fused_calls):
    calls = fused_calls(cope.FUSED_COPE)
    layer = _layer()
    x, layout = _inputs()
    eager_out, eager_grads = _step(layer, x, layout, "eager", causal)
    assert not calls
    fused_out, fused_grads = _step(layer, x, layout, "fused", causal)
    assert calls, "the fused CoPE bias was not used"
    torch.testing.assert_close(fused_out, eager_out, atol=1e-6, rtol=1e-6)
    assert fused_grads.keys() == eager_grads.keys()
    assert "encoding.pos_emb" in fused_grads, "the position table got no gradient through the fused path"
    for key in eager_grads:
        torch.testing.assert_close(fused_grads[key], eager_grads[key], atol=1e-5, rtol=1e-5)


def test_auto_stays_eager_on_the_cpu(monkeypatch):
    monkeypatch.setattr(cope.FUSED_COPE, "compiled", lambda *a: pytest.fail("fused on CPU"))
    x, layout = _inputs()
    _step(_layer(), x, layout, "auto")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_auto_fuses_and_matches_eager_in_bf16(fused_calls):
    calls = fused_calls(cope.FUSED_COPE)
    layer = _layer().cuda()
    x, layout = _inputs()
    x, layout = x.cuda(), PositionLayout(layout.coords.cuda(), layout.has_pos.cuda(), layout.valid.cuda(), GRID)
    outputs = {}
    for choice in ("eager", "auto"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outputs[choice], _ = _step(layer, x, layout, choice)
    assert calls, "auto did not fuse on CUDA"
    torch.testing.assert_close(outputs["auto"].float(), outputs["eager"].float(), atol=2e-2, rtol=2e-2)
