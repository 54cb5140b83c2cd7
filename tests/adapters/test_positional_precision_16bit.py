"""Positional arithmetic stays in float32 under 16-bit autocast (bf16-mixed is CUDA's default).

Autocast runs matmuls and einsums in bf16; positions of tens to hundreds of units (angles of a
64 x 64 grid, seconds x 30 in CAPE's speech setting, token positions above 256) keep no useful
digit there. CPU autocast leaves einsum in float32 while CUDA's casts it, so the first test
emulates CUDA's policy: the ops of its lower-precision list see bf16 inputs.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from pe_bench.adapters import Geometry, PositionLayout, build
from pe_bench.adapters.base import sinusoid_features
from pe_bench.adapters.rope import rotation_angles
from pe_bench.adapters.rope_mixed import mixed_frequencies

# the contractions of CUDA autocast's lower-precision list (ATen/autocast_mode.h) these paths could reach
CUDA_BF16_OPS = {torch.einsum, torch.matmul, torch.mm, torch.bmm, torch.Tensor.__matmul__, torch.nn.functional.linear}


class CudaAutocastPolicy(TorchFunctionMode):
    """The ops CUDA autocast runs in bf16 get bf16 floating inputs, as there."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in CUDA_BF16_OPS:
            args = tuple(a.bfloat16() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        return func(*args, **(kwargs or {}))


def centred_grid(side: int) -> PositionLayout:
    layout = PositionLayout.grid(1, (side, side), 1)
    return layout.with_coords(layout.coords - (side - 1) / 2)


def test_rope_mixed_angles_are_float32_under_cuda_autocast():
    """Until stop 61 the per-head angles were an einsum, which CUDA runs in bf16: 0.6 logits
    of error on a 64 x 64 grid, 8x the bf16 rounding of q and k themselves."""
    frequencies = mixed_frequencies(12, 2, 16, 10.0)
    layout = centred_grid(64)
    exact = rotation_angles(layout, frequencies)
    with CudaAutocastPolicy():
        emulated = rotation_angles(layout, frequencies)
    assert emulated.dtype == torch.float32
    assert torch.equal(emulated, exact)


def test_cuda_policy_emulation_does_round_an_einsum():
    """The emulation above can fail: an einsum of the same operands comes out in bf16."""
    coords, frequencies = centred_grid(64).coords, mixed_frequencies(12, 2, 16, 10.0)
    with CudaAutocastPolicy():
        rounded = torch.einsum("bnp,hpf->bhnpf", coords, frequencies)
    assert rounded.dtype == torch.bfloat16


def test_sinusoid_phases_are_float32_under_autocast():
    """CAPE's features: a bf16 phase of 810 rad (27 s x 30) is off by up to 2 rad."""
    seconds = torch.linspace(0.0, 27.0, 900).unsqueeze(-1)
    frequencies = 30.0 * torch.exp(-torch.arange(32) / 32 * torch.log(torch.tensor(10000.0))).unsqueeze(-1)
    exact = sinusoid_features(seconds, frequencies)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = sinusoid_features(seconds, frequencies)
    assert under_autocast.dtype == torch.float32
    assert torch.equal(under_autocast, exact)


def test_cape_embedding_under_autocast_equals_its_float32_features():
    encoding = build("cape", Geometry(pos_dim=1, grid_shape=None, num_prefix_tokens=0), 64, 4, 2).eval()
    layout = encoding.prepare(PositionLayout(coords=torch.linspace(0, 27.0, 300).view(1, 300, 1) * 30,
                                             has_pos=torch.ones(1, 300, dtype=torch.bool)))  # fmt: skip
    x = torch.zeros(1, 300, 64)
    exact = encoding.embed(x, layout)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rounded_once = encoding.embed(x.bfloat16(), layout)
    torch.testing.assert_close(rounded_once.float(), exact.bfloat16().float(), rtol=0, atol=0)


def test_sincos_embeds_positions_as_given_and_keeps_the_activations_dtype():
    """bf16 activations: positions 256 and 257 must not merge (they did: the positions were
    rounded to the activations' dtype before the phases), and the residual stream stays bf16."""
    encoding = build("sincos", Geometry(pos_dim=1, grid_shape=None, num_prefix_tokens=0), 64, 4, 2)
    positions = torch.arange(250, 270, dtype=torch.float32).view(1, 20, 1)
    layout = PositionLayout(coords=positions, has_pos=torch.ones(1, 20, dtype=torch.bool))
    x = torch.zeros(1, 20, 64)
    exact = encoding.embed(x, layout)
    in_bf16 = encoding.embed(x.bfloat16(), layout)
    assert in_bf16.dtype == torch.bfloat16
    assert torch.equal(in_bf16, exact.bfloat16())
    assert not torch.equal(in_bf16[0, 6], in_bf16[0, 7])  # positions 256 and 257


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rope_mixed_angles_and_cape_phases_under_real_cuda_autocast():
    """The emulated policy's claim on the real thing: CUDA's bf16 autocast leaves both in float32."""
    frequencies = mixed_frequencies(12, 2, 16, 10.0).cuda()
    grid = centred_grid(64)
    layout = PositionLayout(coords=grid.coords.cuda(), has_pos=grid.has_pos.cuda())
    exact = rotation_angles(layout, frequencies)
    seconds = torch.linspace(0.0, 27.0, 900, device="cuda").unsqueeze(-1)
    phases = 30.0 * torch.exp(-torch.arange(32, device="cuda") / 32 * 9.21).unsqueeze(-1)
    exact_features = sinusoid_features(seconds, phases)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.equal(rotation_angles(layout, frequencies), exact)
        assert torch.equal(sinusoid_features(seconds, phases), exact_features)
