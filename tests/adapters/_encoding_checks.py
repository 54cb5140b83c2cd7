"""Small shared helpers for the per-encoding tests (tests/test_enc_*.py).

Not a conformance suite: only the plumbing (building an attention layer around an encoding,
random layouts, padding) so each test file can state its paper-specific checks briefly.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from pe_bench.adapters import Geometry, PositionLayout, build
from pe_bench.harness.attention import Attention

DIM, HEADS = 32, 4


def make_attention(
    name: str,
    pos_dim: int,
    options: dict | None = None,
    grid_shape: tuple[int, ...] | None = None,
    cross: bool = False,
    seed: int = 0,
) -> Attention:
    """A float64 attention layer (layer 0) of the named encoding, weights seeded."""
    torch.manual_seed(seed)
    geometry = Geometry(pos_dim=pos_dim, grid_shape=grid_shape)
    encoding = build(name, geometry, DIM, HEADS, depth=1, options=options)
    return Attention(DIM, HEADS, encoding.make_layer(0), cross=cross).double()


def plain_copy(attn: Attention) -> Attention:
    """The same attention weights without any position encoding."""
    plain = Attention(DIM, HEADS, None, cross=attn.cross).double()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("encoding.")})
    return plain


def random_layout(batch: int, n: int, pos_dim: int, prefix: int = 0, scale: float = 4.0, seed: int = 1):
    """``prefix`` position-free tokens then n irregular positions; returns (layout, x)."""
    gen = torch.Generator().manual_seed(seed)
    coords = scale * torch.randn(batch, prefix + n, pos_dim, generator=gen, dtype=torch.float64)
    has_pos = torch.ones(batch, prefix + n, dtype=torch.bool)
    has_pos[:, :prefix] = False
    x = torch.randn(batch, prefix + n, DIM, generator=gen, dtype=torch.float64)
    return PositionLayout(coords=coords, has_pos=has_pos), x


def with_padding(layout: PositionLayout, x: Tensor, extra: int, seed: int = 2) -> tuple[PositionLayout, Tensor]:
    """Append ``extra`` padding tokens with arbitrary (far away) positions and contents."""
    gen = torch.Generator().manual_seed(seed)
    b, n, p = layout.coords.shape
    pad_coords = 50.0 * torch.randn(b, extra, p, generator=gen, dtype=layout.coords.dtype)
    valid = torch.cat([torch.ones(b, n, dtype=torch.bool), torch.zeros(b, extra, dtype=torch.bool)], dim=1)
    padded = PositionLayout(
        coords=torch.cat([layout.coords, pad_coords], dim=1),
        has_pos=torch.cat([layout.has_pos, torch.ones(b, extra, dtype=torch.bool)], dim=1),
        valid=valid,
    )
    x_pad = torch.cat([x, 10.0 * torch.randn(b, extra, x.shape[-1], generator=gen, dtype=x.dtype)], dim=1)
    return padded, x_pad


def assert_padding_inert(attn: Attention, layout: PositionLayout, x: Tensor, extra: int = 5) -> None:
    """Padding appended to the tokens changes neither the real logits nor the real outputs."""
    n = x.shape[1]
    padded, x_pad = with_padding(layout, x, extra)
    torch.testing.assert_close(attn.logits(x_pad, padded)[:, :, :n, :n], attn.logits(x, layout))
    torch.testing.assert_close(attn(x_pad, padded)[:, :n], attn(x, layout))
    # Padding keys are masked out entirely.
    assert torch.isneginf(attn.logits(x_pad, padded)[:, :, :, n:]).all()


def assert_cls_position_free(attn: Attention, layout: PositionLayout, x: Tensor, prefix: int) -> None:
    """The stored coordinates of position-free tokens are ignored, and logits between two
    position-free tokens are the plain q.k / sqrt(h) of the same weights."""
    moved = layout.coords.clone()
    moved[:, :prefix] = 123.0 * torch.randn_like(moved[:, :prefix])
    torch.testing.assert_close(attn.logits(x, replace(layout, coords=moved)), attn.logits(x, layout))
    plain = plain_copy(attn).logits(x, layout)
    torch.testing.assert_close(attn.logits(x, layout)[:, :, :prefix, :prefix], plain[:, :, :prefix, :prefix])


def assert_all_parameters_learn(attn: Attention, layout: PositionLayout, x: Tensor) -> None:
    """A backward pass gives every trainable parameter of the encoding a nonzero gradient."""
    params = {name: p for name, p in attn.encoding.named_parameters() if p.requires_grad}
    assert params, "the encoding has no trainable parameters"
    attn.zero_grad()
    # A non-linear loss of the output: a plain sum could cancel by symmetry.
    attn(x, layout).square().sum().backward()
    for name, p in params.items():
        assert p.grad is not None, f"{name} got no gradient"
        flat = p.grad.flatten()
        assert (flat != 0).all(), f"{name}: {int((flat == 0).sum())} of {flat.numel()} entries got zero gradient"


def random_rotation(pos_dim: int, seed: int) -> Tensor:
    """A random element of SO(P), float64."""
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(pos_dim, pos_dim, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q
