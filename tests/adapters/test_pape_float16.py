"""PaPE and PaPE-RI with float16 q/k (``precision: 16-mixed``): the 16-bit forms must run under
a float16 autocast, and their features must stay within float16's range (65504) at large
extents, where the query's offset column grows as m |a| |s|^2."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, build
from pe_bench.adapters._float32_product import float32_product
from pe_bench.adapters.pape import FLOAT16_FEATURE_LIMIT, widen_heads
from pe_bench.harness.attention import Attention

DIM, HEADS = 32, 4
#: the audit's extent: positions 0..150 per axis (a 16 x 16 grid, 10 apart), where PaPE's
#: widened features reach 1e5 at initialisation and overflowed float16 before the balancing
LARGE_EXTENT = {"grid": (16, 16), "scale": 10.0}
#: each encoding's 16-bit forms with float16 q/k (round: features rounded once, 11 bits)
FORMS = [
    ("pape", {}),
    ("pape", {"low_precision": "round"}),
    ("pape", {"space": "position"}),
    ("pape", {"frame_tile": 4, "low_precision": "round"}),
    ("pape", {"low_precision": "bias"}),
    ("pape-ri", {}),
    ("pape-ri", {"low_precision": "round"}),
    ("pape-ri", {"low_precision": "bias"}),
]


def _layer(method: str, options: dict, grid: tuple[int, ...], device: str = "cpu") -> Attention:
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=len(grid), grid_shape=grid, num_prefix_tokens=1)
    return Attention(DIM, HEADS, build(method, geometry, DIM, HEADS, 1, options).make_layer(0)).to(device)


def _float16_run(layer: Attention, x: torch.Tensor, layout: PositionLayout) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The layer's output under a float16 autocast and the gradients of its input and
    parameters (float32 leaves), for an upstream gradient of ones."""
    x = x.clone().requires_grad_()
    with torch.autocast(x.device.type, dtype=torch.float16):
        out = layer(x, layout)
    out.float().sum().backward()
    return out.detach(), [x.grad] + [p.grad for p in layer.parameters() if p.grad is not None]


@pytest.mark.parametrize(("method", "options"), FORMS, ids=lambda v: v if isinstance(v, str) else str(v))
def test_float16_forms_stay_finite_at_large_extents(method, options):
    """At the audit's 150 x 150 positions the split and round features (PaPE's offset column
    about 1e5) overflowed float16 to inf and the output was NaN; the bias form crashed under
    the float16 autocast. Now every form is finite, forward and backward, and the
    float32-accurate ones (split, bias) stay within float16's rounding of the float32 layer."""
    layer = _layer(method, options, LARGE_EXTENT["grid"])
    layout = PositionLayout.grid(2, LARGE_EXTENT["grid"], 1, scale=LARGE_EXTENT["scale"])
    x = torch.randn(2, layout.coords.shape[1], DIM, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = layer(x, layout)
        q, k, _, inputs = layer._raw_heads(x, layout, None, None, False)
        if options.get("low_precision") != "bias" and "frame_tile" not in options:
            extra = layer.encoding._extra_features(inputs)
            assert max(float(f.abs().max()) for f in extra) > 65504 or method == "pape-ri"  # would overflow
    out, grads = _float16_run(layer, x, layout)
    assert out.dtype == torch.float16
    assert bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(g).all()) for g in grads)
    if options.get("low_precision") != "round":
        assert float((out.float() - reference).abs().max() / reference.abs().max()) < 2e-2


def test_balancing_keeps_every_product_of_the_kernel_to_the_bit():
    """Columns beyond ``FLOAT16_FEATURE_LIMIT`` (here an offset column of 3e4 to 6e4, still
    below float16's 65504, so that the unbalanced split exists to compare with) are scaled by
    a power of two, their key columns by its inverse: every product of float16 numbers the
    kernel forms, and so every sum of them, is the unbalanced split's, bit for bit. Columns
    within the limit are left as they are."""
    gen = torch.Generator().manual_seed(0)
    q_extra = torch.randn(2, 3, 5, 9, generator=gen) * 300
    q_extra[..., 0] = 3e4 + 3e4 * torch.rand(2, 3, 5, generator=gen)  # the large offset column
    k_extra = torch.randn(2, 3, 7, 9, generator=gen) * 30
    k_extra[..., 0] = 1.0  # its key column
    q, k = torch.randn(2, 3, 5, 16).half(), torch.randn(2, 3, 7, 16).half()
    q_ext, k_ext = widen_heads(q, k, q_extra, k_extra, split=True, pad_to=1)
    assert float(q_ext.abs().max()) <= FLOAT16_FEATURE_LIMIT

    def halves(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hi = f.half()
        return hi, (f - hi.float()).half()

    (q_hi, q_lo), (k_hi, k_lo) = halves(q_extra), halves(k_extra)
    unbalanced_q, unbalanced_k = torch.cat([q, q_hi, q_hi, q_lo], -1), torch.cat([k, k_hi, k_lo, k_hi], -1)
    assert bool(torch.isfinite(unbalanced_q).all()) and float(unbalanced_q.abs().max()) > FLOAT16_FEATURE_LIMIT

    def products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # exact in float64
        return a.double().unsqueeze(-2) * b.double().unsqueeze(-3)

    assert torch.equal(products(q_ext, k_ext), products(unbalanced_q, unbalanced_k))
    # only the offset column moved: its query side halved, its key side doubled
    offset = [16, 16 + 9, 16 + 18]
    assert torch.equal(q_ext[..., offset].float() * 2, unbalanced_q[..., offset].float())
    assert torch.equal(k_ext[..., offset].float() / 2, unbalanced_k[..., offset].float())
    rest = [c for c in range(q_ext.shape[-1]) if c not in offset]
    assert torch.equal(q_ext[..., rest], unbalanced_q[..., rest])
    assert torch.equal(k_ext[..., rest], unbalanced_k[..., rest])


def test_balancing_leaves_bf16_untouched():
    """bf16 has float32's range: its features are split as they are, however large."""
    q_extra, k_extra = torch.full((1, 1, 2, 3), 1e6), torch.ones(1, 1, 2, 3)
    q, k = torch.zeros(1, 1, 2, 4, dtype=torch.bfloat16), torch.zeros(1, 1, 2, 4, dtype=torch.bfloat16)
    q_ext, k_ext = widen_heads(q, k, q_extra, k_extra, split=False, pad_to=1)
    assert torch.equal(q_ext[..., 4:], q_extra.bfloat16()) and torch.equal(k_ext[..., 4:], k_extra.bfloat16())


def test_float32_product_is_the_same_under_a_float16_autocast():
    """The bias form's product cuts its features into bf16 pieces whatever the heads' dtype:
    under a float16 autocast it used to fail in the pieces' concatenation ("Unexpected floating
    ScalarType in at::autocast::prioritize"); now it gives the bits it gives without autocast,
    forward and gradients."""
    torch.manual_seed(0)
    a, b = torch.randn(2, 3, 40, 21) * 30, torch.randn(1, 3, 50, 21) * 30
    upstream = torch.randn(2, 3, 40, 50).half()
    results = []
    for autocast in (False, True):
        a_, b_ = a.clone().requires_grad_(), b.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            out = float32_product(a_, b_, out_dtype=torch.float16)
        out.backward(upstream)
        results.append((out.detach(), a_.grad, b_.grad))
    assert results[0][0].dtype == torch.float16
    for plain, autocast in zip(*results, strict=True):
        assert torch.equal(plain, autocast)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("method", "options"), FORMS, ids=lambda v: v if isinstance(v, str) else str(v))
def test_float16_forms_on_cuda(method, options):
    """The same under CUDA's float16 autocast (its kernels, and the float32 product's
    ``bmm(..., out_dtype=float32)``): finite at the large extent, close to the float32 layer."""
    layer = _layer(method, options, LARGE_EXTENT["grid"], device="cuda")
    layout = PositionLayout.grid(2, LARGE_EXTENT["grid"], 1, device="cuda", scale=LARGE_EXTENT["scale"])
    x = torch.randn(2, layout.coords.shape[1], DIM, generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        reference = layer(x, layout)
    out, grads = _float16_run(layer, x, layout)
    assert bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(g).all()) for g in grads)
    if options.get("low_precision") != "round":
        assert float((out.float() - reference).abs().max() / reference.abs().max()) < 2e-2
