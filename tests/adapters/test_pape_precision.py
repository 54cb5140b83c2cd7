"""PaPE's efficient form in 16-bit: the parabola's cancellation must not happen in bf16."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, build
from pe_bench.adapters.base import AttentionInputs
from pe_bench.adapters.pape import widen_heads
from pe_bench.harness.reports.pape_precision import _kernel_gradients, pape_precision_table


def test_split_features_keep_their_dot_products_to_float32_accuracy():
    gen = torch.Generator().manual_seed(0)
    q_extra = 300 * torch.randn(2, 3, 5, 40, generator=gen)  # magnitudes of |a| s^2 on a 64^2 grid
    k_extra = 300 * torch.randn(2, 3, 7, 40, generator=gen)
    q, k = torch.randn(2, 3, 5, 16, dtype=torch.bfloat16), torch.randn(2, 3, 7, 16, dtype=torch.bfloat16)
    exact = (q_extra.double() @ k_extra.double().transpose(-1, -2)) + (q.double() @ k.double().transpose(-1, -2))

    def error(split: bool) -> float:
        q_ext, k_ext = widen_heads(q, k, q_extra, k_extra, split, pad_to=8)
        assert q_ext.dtype == torch.bfloat16 and q_ext.shape[-1] % 8 == 0
        # what a kernel computes: exact products of the 16-bit numbers, wide sums
        return float(((q_ext.double() @ k_ext.double().transpose(-1, -2)) - exact).abs().max())

    scale = float((q_extra.abs() @ k_extra.abs().transpose(-1, -2)).max())
    assert error(split=True) < 2**-15 * scale
    assert error(split=False) > 2**-10 * scale  # rounding to bf16 is far worse


def test_split_leaves_float32_and_float64_untouched():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 4, 8)
    q_extra, k_extra = torch.randn(1, 2, 3, 5), torch.randn(1, 2, 4, 5)
    for split in (True, False):
        q_ext, k_ext = widen_heads(q, k, q_extra, k_extra, split, pad_to=1)
        assert torch.equal(q_ext, torch.cat([q, q_extra], -1)) and torch.equal(k_ext, torch.cat([k, k_extra], -1))


def test_position_projection_stays_float32_under_autocast():
    encoding = build("pape", Geometry(pos_dim=2, grid_shape=(4, 4)), 32, 2, 1)
    layer = encoding.make_layer(0)
    layout = PositionLayout.grid(1, (4, 4))
    inputs = AttentionInputs(x_q=torch.randn(1, 16, 32), x_k=torch.randn(1, 16, 32), query=layout, key=layout)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s_q, _ = layer._frame(inputs)
    assert s_q.dtype == torch.float32


@pytest.fixture(scope="module")
def precision():
    return pape_precision_table(sides=(14, 64), methods=("nopos", "pape", "pape-ri"), dim=128, heads=2, queries=64)


@pytest.mark.parametrize("method", ["pape", "pape-ri"])
def test_bf16_softmax_stays_close_to_float64_up_to_64x64_grids(precision, method):
    """Softmax total variation against float64. What is left in bf16 is the content q . k's
    own rounding (about 5e-4 here); the old rounding of the widened features reached 0.2
    mean, 0.7 max for PaPE at 64 x 64 (see the README's table)."""
    for grid in ("14x14", "64x64"):
        row = precision.loc[(method, grid)]
        assert row["float32 max"] < 1e-3
        assert row["bf16 split mean"] < 2e-3 and row["bf16 split max"] < 1e-2, row
    # the tolerance can fail: PaPE's old formulation misses it at 64 x 64
    assert precision.loc[("pape", "64x64"), "bf16 round max"] > 0.1


def test_bf16_split_error_is_close_to_the_content_logits_own_rounding(precision):
    """The nopos row is the floor every encoding has in bf16 (its q . k rounded); the split
    features must add little to it, where rounding them added up to 400x at 64 x 64."""
    for grid in ("14x14", "64x64"):
        floor = precision.loc[("nopos", grid), "bf16 split mean"]
        assert floor == precision.loc[("nopos", grid), "bf16 round mean"]  # nopos has no variants
        assert 1e-5 < floor < 2e-3
        for method in ("pape", "pape-ri"):
            assert precision.loc[(method, grid), "bf16 split mean"] < 2 * floor, (method, grid)
    rounded = precision.loc[("pape", "64x64"), "bf16 round mean"]
    assert rounded > 20 * precision.loc[("nopos", "64x64"), "bf16 round mean"]


def test_the_kernel_model_of_the_backward_is_autograds_up_to_16_bit_rounding():
    """The modelled 16-bit backward (P and dS rounded for the second-stage products) is the
    softmax-attention gradient: within bf16 rounding of float64 autograd (a wrong formula,
    e.g. without the row term D, is off by order 1)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen, dtype=torch.float64) for n in (5, 9, 9))
    upstream = torch.randn(1, 2, 5, 16, generator=gen, dtype=torch.float64)
    bias = torch.randn(1, 2, 5, 9, generator=gen, dtype=torch.float64)  # low_precision: bias
    for with_bias in (None, bias):
        exact = _kernel_gradients(q, k, v, upstream, 0.25, with_bias)
        low = None if with_bias is None else with_bias.float()
        modelled = _kernel_gradients(q.bfloat16(), k.bfloat16(), v.bfloat16(), upstream, 0.25, low)
        assert (exact[2] is None) == (modelled[2] is None) == (with_bias is None)
        for e, m in zip(exact, modelled, strict=True):
            if e is not None:
                assert m.dtype == torch.bfloat16
                assert float((m.double() - e).norm() / e.norm()) < 2e-2


def test_gradients_through_the_widened_heads(precision):
    """What the split does not fix: the fused kernel's backward rounds dS and dq to bf16, and
    the positional part of dq carries the parabola's cancellation, so PaPE's gradients lose
    accuracy with the grid (README: about 6 % at 14 x 14, 100 % at 64 x 64), far above the
    content gradient's own bf16 rounding."""
    for grid in ("14x14", "64x64"):
        floor = precision.loc[("pape", grid), "bf16 content grad"]
        assert 1e-3 < floor < 2e-2
        assert precision.loc[("pape", grid), "float32 grad"] < 1e-3
    assert precision.loc[("pape", "64x64"), "bf16 split grad"] > 0.3
    assert precision.loc[("pape", "64x64"), "bf16 split grad"] > 3 * precision.loc[("pape", "14x14"), "bf16 split grad"]


def test_a_frame_per_tile_of_queries_keeps_forward_and_gradients_at_the_bf16_floor(precision):
    """``frame_tile``: with the narrow rounded features, the softmax stays near the content
    logits' own rounding and the positional gradients near the content gradients' own, at
    every grid (the error follows the tile, not the grid); the global frame's gradients
    do not (previous test)."""
    for grid in ("14x14", "64x64"):
        row = precision.loc[("pape", grid)]
        floor = precision.loc[("nopos", grid), "bf16 split mean"]
        assert row["bf16 tiles mean"] < 4 * floor, (grid, row["bf16 tiles mean"])
        assert row["bf16 tiles grad"] < 3 * row["bf16 content grad"], (grid, row["bf16 tiles grad"])
    assert (
        precision.loc[("pape", "64x64"), "bf16 tiles grad"] < 0.1 * precision.loc[("pape", "64x64"), "bf16 split grad"]
    )
    assert (
        precision.loc[("pape-ri", "64x64"), "bf16 tiles grad"]
        < 3 * precision.loc[("pape-ri", "64x64"), "bf16 content grad"]
    )


def test_positional_bias_form_keeps_forward_and_gradients_at_the_bf16_floor(precision):
    """``low_precision: bias``: the widened features' product formed in float32 as a bias,
    rounded to bf16 after the cancellation, and its backward a float32 matmul: softmax and
    positional gradients near the content's own bf16 rounding at every grid, without frames,
    where the split's gradients are off by tens of percent at 64 x 64 (checked above)."""
    for method in ("pape", "pape-ri"):
        for grid in ("14x14", "64x64"):
            row = precision.loc[(method, grid)]
            floor = precision.loc[("nopos", grid), "bf16 split mean"]
            assert row["bf16 bias mean"] < 3 * floor, (method, grid, row["bf16 bias mean"])
            assert row["bf16 bias grad"] < 3 * row["bf16 content grad"], (method, grid, row["bf16 bias grad"])
    assert (
        precision.loc[("pape", "64x64"), "bf16 bias grad"] < 0.05 * precision.loc[("pape", "64x64"), "bf16 split grad"]
    )


@pytest.mark.parametrize("method", ["pape", "pape-ri"])
def test_positional_bias_is_the_explicit_bias(method):
    """The bias form's float32 product of the efficient features equals Eq. 9's explicit
    bias (float64 here: positions, weights and features; only q is 16-bit, which selects
    the form), CLS row and column included."""
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=(5, 6), num_prefix_tokens=1)
    layout = PositionLayout.grid(2, (5, 6), 1)
    layout = layout.with_coords(layout.coords.double())
    x = torch.randn(2, 31, 32, dtype=torch.float64)
    inputs = AttentionInputs(x_q=x, x_k=x, query=layout, key=layout)
    q = torch.randn(2, 4, 31, 8, dtype=torch.bfloat16)
    bias_layer = build(method, geometry, 32, 4, 1, {"low_precision": "bias"}).make_layer(0).double()
    explicit = build(method, geometry, 32, 4, 1, {"form": "explicit"}).make_layer(0).double()
    explicit.load_state_dict(bias_layer.state_dict())
    got = bias_layer.bias(q, q, inputs)
    assert got.dtype == torch.float64 and got.shape == (2, 4, 31, 31)
    torch.testing.assert_close(got, explicit.bias(q, q, inputs), rtol=1e-10, atol=1e-10)
    assert bias_layer.transform_qk(q, q, inputs)[0] is q  # the heads stay unwidened


def test_positional_bias_form_is_the_widened_form_in_float32():
    """32-bit q/k need no bias: the option leaves them on the widened, exact form (bit for bit)."""
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=(4, 4), num_prefix_tokens=1)
    layout = PositionLayout.grid(1, (4, 4), 1)
    from pe_bench.harness.attention import Attention

    encodings = [build("pape", geometry, 32, 2, 1, {"low_precision": lp}) for lp in ("bias", "split")]
    layers = [Attention(32, 2, encoding.make_layer(0)) for encoding in encodings]
    layers[1].load_state_dict(layers[0].state_dict())
    x = torch.randn(1, 17, 32)
    assert layers[0].encoding.bias(torch.randn(1, 2, 17, 16), None, None) is None
    assert torch.equal(layers[0](x, layout), layers[1](x, layout))


def test_positional_bias_form_refuses_tiles():
    from pe_bench.adapters.base import Principle

    for method in ("pape", "pape-ri"):  # an N x N bias in 16 bits: no fused-kernel claim
        encoding = build(method, Geometry(pos_dim=2, grid_shape=(4, 4)), 32, 2, 1, {"low_precision": "bias"})
        assert Principle.FUSED_KERNEL not in encoding.claimed_principles()

    with pytest.raises(ValueError, match="frame_tile does not combine with low_precision 'bias'"):
        build("pape", Geometry(pos_dim=2, grid_shape=(4, 4)), 32, 2, 1, {"low_precision": "bias", "frame_tile": 2})


def test_float32_product_on_bf16_pieces_is_float32_accurate():
    """The bias form's product of float32 features as six products of bf16 pieces
    (adapters/_float32_product.py): within 3x a float32 matmul's rounding of the float64
    product, and both gradients within 2^-20, for a key side shared by the batch too; a product of the features
    rounded to bf16 (what TF32 or one bf16 matmul would do) misses it by orders of magnitude."""
    from pe_bench.adapters._float32_product import float32_product, pieces

    torch.manual_seed(0)
    x = torch.randn(4096) * 1e3
    hi, mid, lo = pieces(x)
    assert {hi.dtype, mid.dtype, lo.dtype} == {torch.bfloat16}
    assert torch.equal(hi.double() + mid.double() + lo.double(), x.double())  # 24 bits in three pieces

    # features like PaPE's at 64 x 64: large terms whose product cancels
    a = (torch.randn(2, 3, 40, 101) * 30).requires_grad_()
    b = (torch.randn(1, 3, 50, 101) * 30).requires_grad_()
    exact_a, exact_b = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    exact = exact_a @ exact_b.transpose(-1, -2)
    got = float32_product(a, b)
    assert got.dtype == torch.float32 and got.shape == (2, 3, 40, 50)
    scale = (exact_a.detach().abs() @ exact_b.detach().abs().transpose(-1, -2)).max()  # the sums' terms' size
    forward_error = float((got.detach().double() - exact.detach()).abs().max() / scale)
    float32_error = float(((a.detach() @ b.detach().transpose(-1, -2)).double() - exact.detach()).abs().max() / scale)
    assert forward_error < 3 * float32_error  # measured 1.8x: six partial sums instead of one
    rounded = a.detach().bfloat16().double() @ b.detach().bfloat16().double().transpose(-1, -2)
    assert float((rounded - exact.detach()).abs().max() / scale) > 1000 * forward_error

    upstream = torch.randn(got.shape).bfloat16().float()  # SDPA returns the bias's gradient in bf16
    got.backward(upstream)
    exact.backward(upstream.double())
    assert b.grad.shape == b.shape  # the shared side's gradient summed over the batch
    for mine, reference in ((a.grad, exact_a.grad), (b.grad, exact_b.grad)):
        assert float((mine.double() - reference).norm() / reference.norm()) < 2**-20

    # rounded once to the heads' dtype, as SDPA takes the bias: the float32 result's rounding,
    # and its bf16 gradient gives the same gradients as the float32 one carrying its values
    grads, a.grad, b.grad = (a.grad, b.grad), None, None
    low = float32_product(a, b, out_dtype=torch.bfloat16)
    assert low.dtype == torch.bfloat16 and torch.equal(low, got.detach().bfloat16())
    low.backward(upstream.bfloat16())
    assert torch.equal(a.grad, grads[0]) and torch.equal(b.grad, grads[1])


def test_float32_product_with_prepared_keys_is_the_product_with_its_gradients():
    """Keys cut into pieces once (``keys_for_product``, what the chunks of queries of one
    attention call share) give every chunk the bits of the whole product, and the chunks'
    gradients add up to the whole's for the shared keys. Prepared without autograd they hold
    no backward operands, and a backward through them is refused by name."""
    from pe_bench.adapters._float32_product import float32_product, keys_for_product

    torch.manual_seed(0)
    a = (torch.randn(2, 3, 40, 21) * 30).requires_grad_()
    b = (torch.randn(1, 3, 50, 21) * 30).requires_grad_()
    upstream = torch.randn(2, 3, 40, 50).bfloat16()
    whole = float32_product(a, b, out_dtype=torch.bfloat16)
    whole.backward(upstream)
    grads, a.grad, b.grad = (a.grad, b.grad), None, None

    keys = keys_for_product(b)
    parts = [float32_product(a[:, :, rows], keys, out_dtype=torch.bfloat16) for rows in (slice(0, 13), slice(13, 40))]
    assert torch.equal(torch.cat(parts, dim=2), whole.detach())
    torch.autograd.backward(parts, [upstream[:, :, :13], upstream[:, :, 13:]])
    torch.testing.assert_close(a.grad, grads[0], rtol=0, atol=0)
    assert float((b.grad - grads[1]).norm() / grads[1].norm()) < 1e-6  # float32 sums of two parts, not one

    with torch.no_grad():
        frozen = keys_for_product(b)
    assert frozen.backward is None
    with pytest.raises(RuntimeError, match="keys were prepared without autograd"):
        float32_product(a, frozen).sum().backward()


@pytest.mark.parametrize("width", [2, 101])
def test_float32_product_lays_out_shared_keys_either_way_with_the_same_result(width, monkeypatch):
    """Keys shared by the batch multiply head-major (one GEMM per head over the whole batch's
    rows) or per sample (the keys copied over the batch), whichever writes less
    (``_head_major_pays``: head-major when 19 w > n, and always without autograd): both
    layouts give the float64 product and gradients to float32 accuracy, and each other's."""
    from pe_bench.adapters import _float32_product

    torch.manual_seed(0)
    a = (torch.randn(3, 2, 40, width) * 30).requires_grad_()
    b = (torch.randn(1, 2, 30, width) * 30).requires_grad_()
    upstream = torch.randn(3, 2, 40, 30).bfloat16()
    exact_a, exact_b = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    exact = exact_a @ exact_b.transpose(-1, -2)
    exact.backward(upstream.double())
    scale = (exact_a.detach().abs() @ exact_b.detach().abs().transpose(-1, -2)).max()
    # the rule: 19 w > n decides under autograd (n = 40 queries per sample here)
    assert _float32_product._head_major_pays(a, b, training=True) == (19 * width > 40)
    assert _float32_product._head_major_pays(a, b, training=False)
    assert not _float32_product._head_major_pays(a, b.expand(3, -1, -1, -1), training=False)
    results = []
    for head_major in (True, False):
        monkeypatch.setattr(_float32_product, "_head_major_pays", lambda *args, choice=head_major: choice)
        a.grad = b.grad = None
        out = _float32_product.float32_product(a, b)
        out.backward(upstream.float())
        assert out.is_contiguous() and out.shape == (3, 2, 40, 30)
        assert float((out.detach().double() - exact.detach()).abs().max() / scale) < 2**-21
        for mine, reference in ((a.grad, exact_a.grad), (b.grad, exact_b.grad)):
            assert float((mine.double() - reference).norm() / reference.norm()) < 2**-20
        results.append((out.detach(), a.grad, b.grad))
    for head_major, per_sample in zip(*results, strict=True):
        assert float((head_major - per_sample).norm() / per_sample.norm()) < 1e-6


@pytest.mark.parametrize("frozen", ["keys", "queries"])
def test_float32_product_computes_only_the_gradients_asked_for(frozen, monkeypatch):
    """A side without a gradient (PaPE-RI's keys under its frozen w_p depend on positions
    alone) costs no backward product: one bmm forward and one backward, and the other side's
    gradient is still float32-accurate."""
    from pe_bench.adapters import _float32_product

    torch.manual_seed(0)
    a = (torch.randn(3, 2, 40, 4) * 30).requires_grad_(frozen != "queries")
    b = (torch.randn(1, 2, 30, 4) * 30).requires_grad_(frozen != "keys")
    upstream = torch.randn(3, 2, 40, 30).bfloat16()
    exact_a, exact_b = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (exact_a @ exact_b.transpose(-1, -2)).backward(upstream.double())
    real_bmm, calls = torch.bmm, []
    monkeypatch.setattr(torch, "bmm", lambda *args, **kwargs: calls.append(1) or real_bmm(*args, **kwargs))
    _float32_product.float32_product(a, b, out_dtype=torch.bfloat16).backward(upstream)
    assert len(calls) == 2
    learned, reference = (a, exact_a) if frozen == "keys" else (b, exact_b)
    assert float((learned.grad.double() - reference.grad).norm() / reference.grad.norm()) < 2**-20


@pytest.mark.parametrize("head_major", [True, False])
def test_float32_product_cuda_branch_with_bf16_operands_matches_the_cpu_branch(head_major, monkeypatch):
    """The branch CUDA runs (bf16 operands kept as they are, ``bmm(..., out_dtype=float32)``),
    here on the CPU with that bmm emulated by float32 products of the same bf16 numbers: the
    same values, forward and gradients, in both layouts, as the CPU branch. It checks the
    CUDA branch's layout and operand handling where no GPU is (the `gpu` test below checks
    the real kernel)."""
    from pe_bench.adapters import _float32_product

    torch.manual_seed(0)
    a, b = torch.randn(3, 2, 40, 101) * 30, torch.randn(1, 2, 30, 101) * 30
    upstream = torch.randn(3, 2, 40, 30).bfloat16()
    monkeypatch.setattr(_float32_product, "_head_major_pays", lambda *args: head_major)
    real_bmm, operands = torch.bmm, []

    def emulated_bmm(x, y, out_dtype=None):
        operands.append((x.dtype, y.dtype))
        return real_bmm(x.float(), y.float()) if out_dtype == torch.float32 else real_bmm(x, y)

    results = []
    for cuda_branch in (False, True):
        if cuda_branch:
            monkeypatch.setattr(_float32_product, "_operand", lambda x: x)
            monkeypatch.setattr(torch, "bmm", emulated_bmm)
        a_, b_ = a.clone().requires_grad_(), b.clone().requires_grad_()
        out = _float32_product.float32_product(a_, b_, out_dtype=torch.bfloat16)
        out.backward(upstream)
        results.append((out.detach(), a_.grad, b_.grad))
    assert operands and set(operands) == {(torch.bfloat16, torch.bfloat16)}  # forward and both backward products
    assert len(operands) == 3
    for cpu, cuda in zip(*results, strict=True):
        assert cpu.shape == cuda.shape
        torch.testing.assert_close(cuda, cpu, rtol=1e-6, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_float32_product_on_cuda_runs_on_the_matrix_units_and_matches(monkeypatch):
    """On CUDA the pieces multiply by ``bmm(..., out_dtype=float32)`` (bf16 tensor cores with
    float32 sums), and TF32 settings change nothing: the same result as on the CPU's float32
    products of the same pieces, forward and gradients, to float32 rounding."""
    from pe_bench.adapters import _float32_product

    assert _float32_product._WIDE_BMM, "this torch lacks bmm(..., out_dtype=): the CUDA path falls back"
    torch.manual_seed(0)
    a, b = torch.randn(2, 3, 64, 101) * 30, torch.randn(1, 3, 48, 101) * 30
    upstream = torch.randn(2, 3, 64, 48).bfloat16().float()
    results = []
    for device in ("cpu", "cuda"):
        a_dev, b_dev = a.to(device).requires_grad_(), b.to(device).requires_grad_()
        out = _float32_product.float32_product(a_dev, b_dev)
        out.backward(upstream.to(device))
        results.append([t.detach().cpu() for t in (out, a_dev.grad, b_dev.grad)])
    for cpu, cuda in zip(*results, strict=True):
        torch.testing.assert_close(cuda, cpu, rtol=1e-5, atol=1e-3)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    with torch.no_grad():
        tf32 = _float32_product.float32_product(a.cuda(), b.cuda()).cpu()
    torch.testing.assert_close(tf32, results[0][0], rtol=1e-5, atol=1e-3)
