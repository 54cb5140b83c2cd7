"""A position-free basis change of q and k (STRING's P or Fourier basis, ``LayerEncoding.qk_basis``)
folded into the q/k projections by the attention core gives the function of applying it to every
token's q and k: outputs, logits and every gradient, in self- and cross-attention, with padding
and position-free tokens; bf16 autocast stays as close to float64 as the per-token form."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import PositionLayout
from pe_bench.harness.conformance.probes import make_attention, random_layout

STRINGS = ("string-cayley", "string-circulant")


def pair(name: str, pos_dim: int, cross: bool = False):
    """The per-token and the folded layer of one encoding with identical, trained-like weights."""
    per_token = make_attention(name, pos_dim, {"basis": "per_token"}, cross=cross, seed=3)
    with torch.no_grad():  # away from the start (P = I, axial phases), where M would be trivial
        for parameter in per_token.encoding.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    folded = make_attention(name, pos_dim, {"basis": "folded"}, cross=cross, seed=3)
    folded.load_state_dict(per_token.state_dict())
    return per_token, folded


def padded(layout: PositionLayout, x: torch.Tensor) -> PositionLayout:
    """The layout with the last two tokens of the first sample as padding."""
    valid = torch.ones(x.shape[:2], dtype=torch.bool)
    valid[0, -2:] = False
    return PositionLayout(coords=layout.coords, has_pos=layout.has_pos, valid=valid)


def gradients(attn, out: torch.Tensor) -> dict[str, torch.Tensor]:
    attn.zero_grad()
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return {name: p.grad.clone() for name, p in attn.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", STRINGS)
@pytest.mark.parametrize("pos_dim", [1, 2, 3])
def test_folded_basis_is_the_per_token_function(name: str, pos_dim: int) -> None:
    per_token, folded = pair(name, pos_dim)
    layout, x = random_layout(2, 9, pos_dim, prefix=1)
    layout = padded(layout, x)
    outs = [attn(x, layout) for attn in (per_token, folded)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(folded.logits(x, layout), per_token.logits(x, layout), rtol=1e-12, atol=1e-12)
    expected, got = gradients(per_token, outs[0]), gradients(folded, outs[1])
    assert set(got) == set(expected) and "qkv.weight" in got and any(n.startswith("encoding.") for n in got)
    for parameter in expected:
        torch.testing.assert_close(got[parameter], expected[parameter], rtol=1e-10, atol=1e-12, msg=parameter)


@pytest.mark.parametrize("name", STRINGS)
def test_folded_basis_in_cross_attention(name: str) -> None:
    per_token, folded = pair(name, 2, cross=True)
    query, x = random_layout(2, 5, 2, prefix=1, seed=4)
    key, context = random_layout(2, 8, 2, seed=5)
    outs = [attn(x, query, context=context, key=key) for attn in (per_token, folded)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    expected, got = gradients(per_token, outs[0]), gradients(folded, outs[1])
    assert {"q.weight", "kv.weight", "kv.bias"} <= set(got)
    for parameter in expected:
        torch.testing.assert_close(got[parameter], expected[parameter], rtol=1e-10, atol=1e-12, msg=parameter)


@pytest.mark.parametrize("name", STRINGS)
def test_folded_basis_leaves_v_and_the_plain_projection_alone(name: str) -> None:
    """Only q's and k's rows are changed, and only for the call: v is the plain projection's,
    and the stored weight is not modified."""
    _, folded = pair(name, 2)
    layout, x = random_layout(1, 6, 2)
    weight = folded.qkv.weight.detach().clone()
    _, _, v, inputs = folded._raw_heads(x, layout, None, None, False)
    assert inputs.qk_in_basis
    plain_v = folded._heads(folded.qkv(x), blocks=3)[2]
    torch.testing.assert_close(v, plain_v, rtol=0, atol=0)
    assert torch.equal(folded.qkv.weight, weight)


@pytest.mark.parametrize("name", STRINGS)
def test_bf16_autocast_folded_is_as_close_to_float64_as_per_token(name: str) -> None:
    """Under autocast the fold runs in the weights' float32 and the folded weights are rounded
    to bf16 once, as plain weights are: the error to float64 stays that of the per-token form."""
    per_token, folded = pair(name, 2)
    layout, x = random_layout(2, 16, 2, prefix=1)
    reference = per_token(x, layout)
    errors = {}
    for label, attn in (("per_token", per_token), ("folded", folded)):
        low = attn.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = low(x.float(), PositionLayout(coords=layout.coords.float(), has_pos=layout.has_pos))
        errors[label] = (out.double() - reference).abs().max().item()
    scale = reference.abs().max().item()
    assert errors["folded"] < 0.02 * scale, errors
    assert errors["folded"] < 2.0 * errors["per_token"], errors


@pytest.mark.parametrize("name", STRINGS)
def test_auto_folds_on_cuda_only(name: str) -> None:
    """ "auto" keeps the per-token arithmetic of the stored (CPU, float32) records on the CPU."""
    layer = make_attention(name, 2).encoding
    assert layer.fold_qk_basis(torch.device("cuda")) and not layer.fold_qk_basis(torch.device("cpu"))
    layout, x = random_layout(1, 4, 2)
    _, _, _, inputs = make_attention(name, 2)._raw_heads(x, layout, None, None, False)
    assert not inputs.qk_in_basis


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", STRINGS)
def test_cuda_auto_folds_and_matches_per_token(name: str) -> None:
    per_token, _ = pair(name, 2)
    auto = make_attention(name, 2, seed=3).cuda()
    auto.load_state_dict(per_token.state_dict())
    layout, x = random_layout(2, 12, 2, prefix=1)
    on_gpu = PositionLayout(coords=layout.coords.cuda(), has_pos=layout.has_pos.cuda())
    _, _, _, inputs = auto._raw_heads(x.cuda(), on_gpu, None, None, False)
    assert inputs.qk_in_basis
    torch.testing.assert_close(auto(x.cuda(), on_gpu).cpu(), per_token(x, layout), rtol=1e-10, atol=1e-10)
