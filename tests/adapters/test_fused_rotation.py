"""The rotation of q and k as one compiled function (``rope.rotate_both``, CUDA's default):
the same outputs and gradients as the eager passes, for every encoding that rotates.

On CPU "fused" is forced (Inductor's C++ kernels); "auto" keeps the CPU eager, whose
stored records were trained that way."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, build, rope
from pe_bench.adapters.rope import rotation_kernel
from pe_bench.harness.attention import Attention
from pe_bench.harness.conformance.probes import padded_grid

DIM, HEADS = 48, 3  # head width 16
ROTATING = ["rope", "rope-mixed", "string-cayley", "string-circulant"]
GRIDS = {2: (4, 5), 3: (3, 3, 2)}


def _layer(name: str, pos_dim: int = 2) -> Attention:
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=pos_dim, grid_shape=GRIDS[pos_dim], num_prefix_tokens=1)
    return Attention(DIM, HEADS, build(name, geometry, DIM, HEADS, depth=1).make_layer(0))


def _inputs(pos_dim: int = 2) -> tuple[torch.Tensor, PositionLayout]:
    return padded_grid(GRIDS[pos_dim], DIM)  # padding in the second sample


def _step(layer: Attention, x: torch.Tensor, layout: PositionLayout, policy: str):
    layer.zero_grad()
    with rotation_kernel(policy):
        out = layer(x, layout) * layout.valid[..., None]
    out.square().sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ROTATING)
@pytest.mark.parametrize("pos_dim", [2, 3])
def test_fused_rotation_equals_the_eager_passes(name, pos_dim, fused_calls):
    calls = fused_calls(rope.FUSED_ROTATION)
    layer = _layer(name, pos_dim)
    x, layout = _inputs(pos_dim)
    eager_out, eager_grads = _step(layer, x, layout, "eager")
    assert not calls
    fused_out, fused_grads = _step(layer, x, layout, "fused")
    assert calls, "the fused rotation was not used"
    torch.testing.assert_close(fused_out, eager_out, atol=1e-6, rtol=1e-6)
    assert fused_grads.keys() == eager_grads.keys()
    learned = {f"encoding.{key}" for key, _ in layer.encoding.named_parameters()}
    assert learned <= fused_grads.keys(), "a learned rotation parameter got no gradient through the fused path"
    for key in eager_grads:  # RoPE-Mixed's and STRING's learned parameters included
        torch.testing.assert_close(fused_grads[key], eager_grads[key], atol=1e-5, rtol=1e-5)


def test_auto_stays_eager_on_the_cpu(monkeypatch):
    monkeypatch.setattr(rope.FUSED_ROTATION, "compiled", lambda *a: pytest.fail("fused on CPU"))
    x, layout = _inputs()
    _step(_layer("rope"), x, layout, "auto")


def test_auto_falls_back_visibly_when_the_fused_rotation_fails(monkeypatch):
    def broken(*args):
        raise torch._dynamo.exc.InternalTorchDynamoError("no compiler here")

    monkeypatch.setattr(rope.FUSED_ROTATION, "auto_on", lambda device: True)
    monkeypatch.setattr(rope.FUSED_ROTATION, "compiled", broken)
    monkeypatch.setattr(rope.FUSED_ROTATION, "failed", [])
    layer = _layer("rope")
    x, layout = _inputs()
    with pytest.warns(RuntimeWarning, match="fused rotation did not compile.*no compiler here"):
        fallback, _ = _step(layer, x, layout, "auto")
    reference, _ = _step(layer, x, layout, "eager")
    assert torch.equal(fallback, reference)
    assert len(rope.FUSED_ROTATION.failed) == 1  # later calls go eager without warning again
    with rotation_kernel("fused"), pytest.raises(RuntimeError, match="no compiler here"):
        layer(x, layout)  # a forced "fused" raises instead


def test_auto_does_not_hide_errors_of_running(monkeypatch):
    """Out of memory inside the fused rotation is an error, not a reason to go eager."""

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(rope.FUSED_ROTATION, "auto_on", lambda device: True)
    monkeypatch.setattr(rope.FUSED_ROTATION, "compiled", out_of_memory)
    monkeypatch.setattr(rope.FUSED_ROTATION, "failed", [])
    x, layout = _inputs()
    with pytest.raises(torch.OutOfMemoryError):
        _layer("rope")(x, layout)
    assert rope.FUSED_ROTATION.failed == []


def test_counting_modes_see_the_eager_passes(monkeypatch):
    """FLOP and operator counters (dispatch modes) cannot see into a compiled function, and
    Dynamo refuses to run one under them: the rotation runs eagerly there, even forced."""
    from torch.utils.flop_counter import FlopCounterMode

    monkeypatch.setattr(rope.FUSED_ROTATION, "compiled", lambda *a: pytest.fail("fused under a counting mode"))
    x, layout = _inputs()
    with rotation_kernel("fused"), FlopCounterMode(display=False) as counter:
        _layer("rope")(x, layout)
    assert counter.get_total_flops() > 0


def test_an_unknown_rotation_policy_is_named():
    with pytest.raises(ValueError, match="auto.*fused.*eager"), rotation_kernel("triton"):
        pass


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ROTATING)
def test_cuda_auto_fuses_and_matches_eager_in_bf16(name, fused_calls):
    calls = fused_calls(rope.FUSED_ROTATION)
    layer = _layer(name).cuda()
    x, layout = _inputs()
    x = x.cuda()
    layout = PositionLayout(layout.coords.cuda(), layout.has_pos.cuda(), layout.valid.cuda(), layout.grid_shape)
    results = {}
    for policy in ("eager", "auto"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results[policy] = _step(layer, x, layout, policy)
    assert calls, "auto did not fuse on CUDA"
    torch.testing.assert_close(results["auto"][0], results["eager"][0], atol=2e-2, rtol=2e-2)
    for key, grad in results["eager"][1].items():
        torch.testing.assert_close(results["auto"][1][key], grad, atol=5e-2, rtol=5e-2)
