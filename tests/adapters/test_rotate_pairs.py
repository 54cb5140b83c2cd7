"""``rotate_pairs``: the three-pass form (t * cos' + swap(t) * sin') is the pairwise rotation
of RoFormer's Eq. 34, channel pairs (2i, 2i+1), with the channels past 2F passed through."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters.rope import rotate_pairs


def _pairwise(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The definition, pair by pair: (x, y) -> (x cos - y sin, x sin + y cos)."""
    out = t.clone()
    for f in range(cos.shape[-1]):
        x, y = t[..., 2 * f], t[..., 2 * f + 1]
        out[..., 2 * f] = x * cos[..., f] - y * sin[..., f]
        out[..., 2 * f + 1] = x * sin[..., f] + y * cos[..., f]
    return out


@settings(max_examples=25, deadline=None)
@given(pairs=st.integers(1, 6), extra=st.integers(0, 3), heads=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_equals_the_pairwise_rotation(pairs, extra, heads, seed):
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(2, heads, 5, 2 * pairs + extra, generator=gen, dtype=torch.float64)
    angles = 10 * torch.randn(2, 1, 5, pairs, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(rotate_pairs(t, angles.cos(), angles.sin()), _pairwise(t, angles.cos(), angles.sin()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gives_the_pairwise_forms_bits(dtype):
    """The same roundings as the pairwise form (products, then their sum), so records made
    with it stay reproducible bit for bit."""
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(4, 8, 197, 66, generator=gen).to(dtype)
    angles = 20 * torch.rand(4, 1, 197, 32, generator=gen)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    assert torch.equal(rotate_pairs(t, cos, sin), _pairwise(t, cos, sin))
