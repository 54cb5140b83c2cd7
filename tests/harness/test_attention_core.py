"""The shared attention core: fused SDPA path for bias-free encodings, masks, cross-attention."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

from pe_bench.adapters import Geometry, PositionLayout, available, build, get
from pe_bench.adapters.base import Principle
from pe_bench.harness import attention as attention_module
from pe_bench.harness.attention import Attention

FUSED = [name for name in available() if Principle.FUSED_KERNEL in get(name).principles]


@pytest.mark.parametrize("name", FUSED)
def test_fused_encodings_reach_a_fused_sdpa_backend(name, monkeypatch):
    """Not just 'no N x N mask': SDPA must actually pick a fused kernel, not the math one
    (which materialises N x N). Widened q/k with a narrower v would silently fall back."""
    chosen = []
    real = attention_module.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        chosen.append(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    geometry = Geometry(pos_dim=2, grid_shape=(5, 5), num_prefix_tokens=1)
    encoding = build(name, geometry, 64, 4, 1).eval()
    layer = Attention(64, 4, encoding.make_layer(0)).eval()
    layout = encoding.prepare(PositionLayout.grid(2, (5, 5), 1))
    x = encoding.embed(torch.randn(2, 26, 64), layout)
    with torch.no_grad():
        layer(x, layout)
        layout.valid = torch.ones(2, 26, dtype=torch.bool)
        layout.valid[1, -4:] = False
        layer(x, layout)
    assert chosen and all(c != SDPBackend.MATH.value for c in chosen), chosen


def test_causal_and_padding_masks_combine():
    layer = Attention(16, 2).eval()
    n = 5
    layout = PositionLayout.grid(1, (n,))
    layout.valid = torch.tensor([[True, True, True, True, False]])
    logits = layer.logits(torch.randn(1, n, 16), layout, causal=True)
    allowed = torch.isfinite(logits[0, 0])
    expected = torch.ones(n, n, dtype=torch.bool).tril() & layout.valid[0][None, :]
    assert torch.equal(allowed, expected)


def test_causal_cross_attention_aligns_bottom_right_with_or_without_a_padding_mask():
    """Nq != Nk: query i sees keys j <= i + Nk - Nq on every path. SDPA's is_causal aligns
    top-left, so it is used for square attention only (until stop 61 also here, where the
    output then depended on whether an all-True padding mask was passed)."""
    torch.manual_seed(0)
    layer = Attention(16, 2, cross=True).double().eval()
    query, key = PositionLayout.grid(1, (3,)), PositionLayout.grid(1, (5,))
    x, context = torch.randn(1, 3, 16, dtype=torch.float64), torch.randn(1, 5, 16, dtype=torch.float64)
    padded = PositionLayout(coords=key.coords, has_pos=key.has_pos, valid=torch.ones(1, 5, dtype=torch.bool))
    with torch.no_grad():
        plain = layer(x, query, context=context, key=key, causal=True)
        masked = layer(x, query, context=context, key=padded, causal=True)
        logits = layer.logits(x, query, context=context, key=key, causal=True)
    assert torch.isfinite(logits[0, 0]).sum(-1).tolist() == [3, 4, 5]
    torch.testing.assert_close(plain, masked, rtol=0, atol=1e-12)


def test_cross_attention_with_different_lengths():
    layer = Attention(16, 2, cross=True, context_dim=8)
    query = PositionLayout.grid(2, (3,))
    key = PositionLayout.grid(2, (7,))
    out = layer(torch.randn(2, 3, 16), query, context=torch.randn(2, 7, 8), key=key)
    assert out.shape == (2, 3, 16)
    with pytest.raises(ValueError, match="context"):
        layer(torch.randn(2, 3, 16), query)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("options", [{}, {"low_precision": "round"}, {"m": 8}, {"space": "projected"}])
def test_widened_pape_on_cuda_reaches_a_fused_kernel_with_an_unpadded_v(options, monkeypatch):
    """CUDA: v stays at the head width while q/k are widened (PaPE), and SDPA still picks a
    fused kernel in bf16, at ViT-B's head width (64 + 6 channels in position space, CUDA's
    default, 64 + 2m + 1 projected; 3x when split)."""
    chosen = []
    real = attention_module.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        assert v.shape[-1] < q.shape[-1]
        chosen.append(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    geometry = Geometry(pos_dim=2, grid_shape=(14, 14), num_prefix_tokens=1)
    encoding = build("pape", geometry, 768, 12, 1, options).cuda()
    layer = Attention(768, 12, encoding.make_layer(0)).cuda()
    layout = PositionLayout.grid(8, (14, 14), 1, device="cuda")
    x = torch.randn(8, 197, 768, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        layer(x, layout).float().sum().backward()
    assert chosen and all(c != SDPBackend.MATH.value for c in chosen), chosen


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["relpos", "pape[low_precision=bias]", "pape-ri[low_precision=bias]"])
def test_a_learned_dense_bias_gets_its_gradient_from_cuda_sdpa_in_bf16(method, monkeypatch):
    """CUDA, bf16: the dense path hands SDPA a bias that requires grad (relpos' table, PaPE's
    positional bias form). cuDNN's attention backward returns dq, dk and dv only, so a kernel
    that took the bias without returning its gradient would leave those parameters training
    on nothing. Their gradients must match float32's within 25 % (a dropped bias gradient is
    100 % off; bf16's own error is a few %: this CPU's math kernel, which rounds the N x N
    probabilities and dS to bf16, gives 0.5-6 %), and the kernel SDPA picks in training is
    printed (-s) for the record."""
    from pe_bench.harness.grid.methods import parse_method

    chosen = []
    real = attention_module.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        chosen.append(SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale)).name)
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    parsed = parse_method(method)
    geometry = Geometry(pos_dim=2, grid_shape=(14, 14), num_prefix_tokens=1)
    torch.manual_seed(0)
    encoding = build(parsed.name, geometry, 256, 4, 1, dict(parsed.options)).cuda()
    layer = Attention(256, 4, encoding.make_layer(0)).cuda()
    layout = encoding.prepare(PositionLayout.grid(4, (14, 14), 1, device="cuda"))
    x = torch.randn(4, 197, 256, device="cuda")
    grads = {}
    for bf16 in (False, True):
        layer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            layer(x, layout.sharing_features()).float().square().sum().backward()
        grads[bf16] = {n: p.grad.clone() for n, p in layer.encoding.named_parameters() if p.grad is not None}
    print(method, "SDPA kernels (float32, then bf16):", chosen)
    assert grads[True].keys() == grads[False].keys() and grads[False]
    for name, reference in grads[False].items():
        error = ((grads[True][name] - reference).norm() / reference.norm()).item()
        assert reference.abs().max() > 0 and error < 0.25, (name, error)


class _CopiesOfShape(TorchDispatchMode):
    """Records the copies (``clone``) a block dispatches whose output has the shape ``shape``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape, self.copies = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket is torch.ops.aten.clone and tuple(out.shape) == self.shape:
            self.copies += 1
        return out


@pytest.mark.parametrize("name", ["nopos", "rope", "pape", "pape-ri", "relpos"])
@pytest.mark.parametrize("cross", [False, True])
def test_the_head_split_adds_no_copy_of_the_gradients(name, cross):
    """q, k and v are views of the projection's output, and the backward writes the
    projection's gradient from theirs in one pass, whatever layout those come back in (PaPE's
    are slices of its widened heads' gradients, relpos's math kernel returns (B, H, N, D)
    order): no copy of a per-head gradient, (B, N, H, head_dim), first. Before
    ``Attention._heads`` split by ``unbind``, each was reshaped to (B, N, dim) first, a copy of
    q's and of k's gradient per layer for pape, pape-ri and relpos (this test failed there)."""
    geometry = Geometry(pos_dim=2, grid_shape=(5, 5), num_prefix_tokens=1)
    encoding = build(name, geometry, 64, 4, 1)
    layer = Attention(64, 4, encoding.make_layer(0), cross=cross, context_dim=64 if cross else None)
    layout = encoding.prepare(PositionLayout.grid(2, (5, 5), 1))
    x = torch.randn(2, 26, 64)
    context = dict(context=torch.randn(2, 26, 64), key=layout) if cross else {}
    out = layer(x, layout, **context)
    with _CopiesOfShape((2, 26, 4, 16)) as backward:
        out.sum().backward()
    assert backward.copies == 0
    projection = layer.kv if cross else layer.qkv
    assert projection.weight.grad is not None  # the backward reached the split
