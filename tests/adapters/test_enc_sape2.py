"""SaPE²: Eq. 9-16 by hand and by loops, modes, self-attention rule, CLS, padding, +abspos."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import AttentionInputs, Geometry, PositionLayout, Principle, build
from pe_bench.adapters.abspos import LearnableAbsolute
from pe_bench.harness.attention import Attention
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.conformance.probes import with_padding

DIM, HEADS = 32, 4


def make(grid=(4, 4), dim=DIM, heads=HEADS, **options):
    return build("sape2", Geometry(pos_dim=2, grid_shape=grid, num_prefix_tokens=1), dim, heads, 2, options)


def run_bias(layer, q, k, layout, causal=False, key=None):
    x = torch.zeros(1, q.shape[2], 1)
    inputs = AttentionInputs(x_q=x, x_k=x, query=layout, key=layout if key is None else key, causal=causal)
    return layer.bias(q, k, inputs)


def test_hand_computed_one_by_two_grid() -> None:
    """1 x 2 grid, mode q, k = 0 so every gate is 1/2, e^x[m] = e^y[m] = (m^2, 0), q_i = (a_i, 0).

    x: the row holds both patches, p_i(c=1) = 1, p_i(c=2) = 1/2 -> SaPE_x[i] = a_i (1, 0.5)
       (e[1] = 1, e[0.5] = (0 + 1) / 2); y: each column holds one patch, p_i = 1/2 ->
       SaPE_y[i] = a_i * 0.5. Eq. 15-16: b_01 = (|a_0 - a_1| sqrt(1.25) + 0.5 |a_0 - a_1|) / sqrt(2).
    """
    enc = build("sape2", Geometry(pos_dim=2, grid_shape=(1, 2)), 2, 1, 1, {"mode": "q", "npos_max": 3})
    layer = enc.make_layer(0)
    with torch.no_grad():
        for table in (layer.emb_x, layer.emb_y):
            table.zero_()
            table[0] = torch.tensor([0.0, 1.0, 4.0])
    q = torch.tensor([[1.0, 0.0], [3.0, 0.0]]).view(1, 1, 2, 2)
    bias = run_bias(layer, q, torch.zeros_like(q), PositionLayout.grid(1, (1, 2)))[0, 0]
    b01 = (2 * math.sqrt(1.25) + 0.5 * 2) / math.sqrt(2)
    torch.testing.assert_close(bias, torch.tensor([[0.0, b01], [b01, 0.0]]))


def naive_bias(q, k, probe, cells, emb_x, emb_y, height, width):
    """Eq. 9-16 with explicit loops over patches; cells: (N, 2) integer (row, col)."""
    _, h, n, d = q.shape
    cells = cells.tolist()

    def interp(table, p):
        p = min(p, table.shape[1] - 1)
        lo, hi = math.floor(p), math.ceil(p)
        return table[:, hi] * (p - lo) + table[:, lo] * (1 - p + lo)

    out = torch.zeros(h, n, n, dtype=torch.float64)
    for head in range(h):
        vec = []
        for i in range(n):
            gate = [torch.sigmoid(q[0, head, i] @ k[0, head, j] / math.sqrt(d)).item() for j in range(n)]
            vx = []
            for c in range(width):  # Eq. 10: same row, x_j >= c
                p = sum(gate[j] for j in range(n) if cells[j][0] == cells[i][0] and cells[j][1] >= c)
                vx.append((probe[0, head, i] @ interp(emb_x, p)).item())
            vy = []
            for r in range(height):
                p = sum(gate[j] for j in range(n) if cells[j][1] == cells[i][1] and cells[j][0] >= r)
                vy.append((probe[0, head, i] @ interp(emb_y, p)).item())
            vec.append((torch.tensor(vx), torch.tensor(vy)))
        for i in range(n):
            for m in range(n):
                bx = (vec[i][0] - vec[m][0]).norm()
                by = (vec[i][1] - vec[m][1]).norm()
                out[head, i, m] = (bx + by) / math.sqrt(d)
    return out


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(["k", "q"]))
def test_matches_loop_reference(seed: int, mode: str) -> None:
    g = torch.Generator().manual_seed(seed)
    height, width, d = 2, 3, 4
    n = height * width
    cells = torch.stack(torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij"), -1).view(n, 2)
    perm = torch.randperm(n, generator=g)  # token order must not matter, only coordinates
    cells = cells[perm]
    layout = PositionLayout(
        coords=cells.float()[None] + 10.0, has_pos=torch.ones(1, n, dtype=torch.bool), grid_shape=(height, width)
    )
    enc = build("sape2", Geometry(pos_dim=2, grid_shape=(height, width)), d * 2, 2, 1, {"mode": mode})
    layer = enc.make_layer(0)
    q = torch.randn(1, 2, n, d, generator=g) * 2
    k = torch.randn(1, 2, n, d, generator=g) * 2
    got = run_bias(layer, q, k, layout)[0]
    probe = k if mode == "k" else q
    expected = naive_bias(
        q.double(),
        k.double(),
        probe.double(),
        cells,
        layer.emb_x.detach().double(),
        layer.emb_y.detach().double(),
        height,
        width,
    )
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-4)


def test_self_attention_rule() -> None:
    layer = make().make_layer(0)
    layout = PositionLayout.grid(1, (4, 4), num_prefix_tokens=1)
    q, k = torch.randn(2, 1, HEADS, 17, 8).unbind(0)
    same = run_bias(layer, q, k, layout)
    copy = replace(layout, coords=layout.coords.clone())  # another object, same tokens
    torch.testing.assert_close(run_bias(layer, q, k, layout, key=copy), same)
    other = PositionLayout.grid(1, (2, 8), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="self-attention"):
        run_bias(layer, q, k, layout, key=other)


def test_cls_translation_and_claims() -> None:
    torch.manual_seed(0)
    enc = make()
    attn = Attention(DIM, HEADS, enc.make_layer(0))
    plain = Attention(DIM, HEADS)
    plain.load_state_dict(attn.state_dict(), strict=False)
    layout = PositionLayout.grid(1, (4, 4), num_prefix_tokens=1)
    x = torch.randn(1, 17, DIM)
    with_pe, without = attn.logits(x, layout), plain.logits(x, layout)
    torch.testing.assert_close(with_pe[:, :, 0], without[:, :, 0])
    torch.testing.assert_close(with_pe[:, :, :, 0], without[:, :, :, 0])
    assert not torch.allclose(with_pe, without)
    shifted = layout.with_coords(layout.coords + torch.tensor([5.0, -3.0]))
    torch.testing.assert_close(attn.logits(x, shifted), with_pe)
    assert enc.claimed_principles() == {Principle.TRANSLATION_INVARIANCE, Principle.CONTEXT_AWARENESS}


@pytest.mark.parametrize("options", [{"mode": "k"}, {"mode": "q", "abspos": True}])
def test_padding_gradients_and_larger_grid(options) -> None:
    torch.manual_seed(0)
    enc = make(**options)
    model = TransformerEncoder(DIM, 2, HEADS, enc)
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=1)
    x = torch.randn(2, 17, DIM)
    out = model(x, layout)
    padded, x_padded = with_padding(layout, x, 3, torch.Generator().manual_seed(1), at=(0.0, 1.0))  # on a real cell
    out_padded = model(x_padded, padded)
    torch.testing.assert_close(out_padded[:, :17], out, atol=1e-5, rtol=1e-5)

    out.square().sum().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    for block in model.blocks:
        for table in (block.attn.encoding.emb_x, block.attn.encoding.emb_y):
            assert table.grad is not None and table.grad.abs().sum() > 0

    big = model(torch.randn(2, 1 + 7 * 9, DIM), PositionLayout.grid(2, (7, 9), num_prefix_tokens=1))
    assert torch.isfinite(big).all()


def test_abspos_variant_reuses_abspos() -> None:
    enc = make(abspos=True)
    assert isinstance(enc.abspos, LearnableAbsolute)
    assert enc.claimed_principles() == {Principle.CONTEXT_AWARENESS}
    layout = PositionLayout.grid(1, (4, 4), num_prefix_tokens=1)
    x = torch.zeros(1, 17, DIM)
    torch.testing.assert_close(enc.embed(x, layout), enc.abspos.embed(x, layout))
    assert torch.equal(make().embed(x, layout), x)
