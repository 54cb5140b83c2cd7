"""CoPE: Eq. 7-8 gates and counts, interpolation, order from coordinates, CLS, padding."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import AttentionInputs, Geometry, NotApplicableError, PositionLayout, Principle, build
from pe_bench.adapters.abspos import LearnableAbsolute
from pe_bench.adapters.cope import ContextualPosition
from pe_bench.harness.attention import Attention
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.conformance.probes import with_padding

DIM, HEADS = 32, 4


def line(n: int, coords=None) -> PositionLayout:
    c = torch.arange(n, dtype=torch.float32) if coords is None else torch.as_tensor(coords, dtype=torch.float32)
    return PositionLayout(coords=c.view(1, n, 1), has_pos=torch.ones(1, n, dtype=torch.bool), grid_shape=(n,))


def cope_layer(npos_max: int = 4, head_dim: int = 2):
    enc = build("cope", Geometry(pos_dim=1, grid_shape=(3,)), head_dim, 1, 1, {"npos_max": npos_max})
    return enc.make_layer(0)


def run_bias(layer, q, k, layout, causal=False):
    x = torch.zeros(1, q.shape[2], 1)
    return layer.bias(q, k, AttentionInputs(x_q=x, x_k=x, query=layout, key=layout, causal=causal))


def test_hand_computed_three_tokens() -> None:
    """k = 0: every gate is sigmoid(0) = 1/2. With e[m] = (m^2, 0) and q_i = (a_i, 0) the bias
    is a_i * interp(m^2)(p_ij) / sqrt(2) (Eq. 3)."""
    layer = cope_layer()
    with torch.no_grad():
        layer.pos_emb.zero_()
        layer.pos_emb[0] = torch.tensor([0.0, 1.0, 4.0, 9.0])
    a = torch.tensor([1.0, 2.0, -0.5])
    q = torch.stack([a, torch.zeros(3)], -1).view(1, 1, 3, 2)
    k = torch.zeros(1, 1, 3, 2)
    # Non-causal: p_ij = sum_{t >= j} 1/2 = (1.5, 1.0, 0.5) for every i; e = (2.5, 1.0, 0.5)
    # (interpolated: e[1.5] = (1 + 4) / 2, e[0.5] = (0 + 1) / 2).
    expected = a[:, None] * torch.tensor([2.5, 1.0, 0.5]) / math.sqrt(2)
    torch.testing.assert_close(run_bias(layer, q, k, line(3))[0, 0], expected)
    # Causal (Eq. 8): p_ij = sum_{t=j}^{i} 1/2 = (i - j + 1) / 2 for j <= i.
    p = torch.tensor([[0.5, 0.0, 0.0], [1.0, 0.5, 0.0], [1.5, 1.0, 0.5]])
    e = {0.0: 0.0, 0.5: 0.5, 1.0: 1.0, 1.5: 2.5}
    expected = a[:, None] * p.apply_(lambda v: e[v]) / math.sqrt(2)
    got = run_bias(layer, q, k, line(3), causal=True)[0, 0]
    keep = torch.ones(3, 3).tril().bool()
    torch.testing.assert_close(got[keep], expected[keep])


def naive_bias(q, k, coords, table, causal):
    """Eq. 7-8 and interpolation by explicit loops, order from (lexicographic) coordinates."""
    _, h, n, d = q.shape
    out = torch.zeros(h, n, n, dtype=torch.float64)
    keys = [tuple(c) for c in coords.tolist()]
    for head in range(h):
        for i in range(n):
            for j in range(n):
                p = 0.0
                for t in range(n):
                    if keys[t] >= keys[j] and (not causal or t <= i):
                        p += torch.sigmoid(q[0, head, i] @ k[0, head, t] / math.sqrt(d)).item()
                p = min(p, table.shape[1] - 1)
                lo, hi = math.floor(p), math.ceil(p)
                e = table[:, hi] * (p - lo) + table[:, lo] * (1 - p + lo)
                out[head, i, j] = (q[0, head, i] @ e).item() / math.sqrt(d)
    return out


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), causal=st.booleans(), two_d=st.booleans())
def test_matches_loop_reference(seed: int, causal: bool, two_d: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    n, d = 6, 4
    if two_d:  # a 2 x 3 grid, tokens shuffled: raster order must come from the coordinates
        grid = torch.stack(torch.meshgrid(torch.arange(2.0), torch.arange(3.0), indexing="ij"), -1).view(6, 2)
        coords = grid[torch.randperm(n, generator=g)]
    else:  # irregular, unsorted 1-D positions
        coords = (torch.rand(n, generator=g) * 10).view(n, 1)
    layout = PositionLayout(coords=coords[None], has_pos=torch.ones(1, n, dtype=torch.bool))
    layer = cope_layer(npos_max=5, head_dim=d)
    q = torch.randn(1, 2, n, d, generator=g) * 2
    k = torch.randn(1, 2, n, d, generator=g) * 2
    got = run_bias(layer, q, k, layout, causal)[0]
    expected = naive_bias(q.double(), k.double(), coords, layer.pos_emb.detach().double(), causal)
    if causal:
        keep = torch.ones(n, n).tril().bool()
        got, expected = got[:, keep], expected[:, keep]
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-4)


def make(grid=(4, 4), **options):
    return build("cope", Geometry(pos_dim=2, grid_shape=grid, num_prefix_tokens=1), DIM, HEADS, 2, options)


def test_cls_position_free_and_translation_invariance() -> None:
    torch.manual_seed(0)
    enc = make()
    attn = Attention(DIM, HEADS, enc.make_layer(0))
    layout = PositionLayout.grid(1, (4, 4), num_prefix_tokens=1)
    x = torch.randn(1, 17, DIM)
    plain = Attention(DIM, HEADS)
    plain.load_state_dict(attn.state_dict(), strict=False)
    with_pe, without = attn.logits(x, layout), plain.logits(x, layout)
    torch.testing.assert_close(with_pe[:, :, 0], without[:, :, 0])  # CLS row
    torch.testing.assert_close(with_pe[:, :, :, 0], without[:, :, :, 0])  # CLS column
    shifted = layout.with_coords(layout.coords + torch.tensor([2.0, 7.0]))
    torch.testing.assert_close(attn.logits(x, shifted), with_pe)
    assert enc.claimed_principles() == {Principle.TRANSLATION_INVARIANCE, Principle.CONTEXT_AWARENESS}


def test_scaling_positions_changes_nothing_so_interpolation_is_not_offered() -> None:
    torch.manual_seed(0)
    attn = Attention(DIM, HEADS, make().make_layer(0))
    layout = PositionLayout.grid(1, (4, 4), num_prefix_tokens=1)
    x = torch.randn(1, 17, DIM)
    scaled = layout.with_coords(layout.coords * torch.tensor([0.25, 0.5]))  # extrapolation's interpolation
    torch.testing.assert_close(attn.logits(x, scaled), attn.logits(x, layout))
    assert not ContextualPosition.supports_position_interpolation


def test_padding_gradients_and_larger_grid() -> None:
    torch.manual_seed(0)
    enc = make()
    model = TransformerEncoder(DIM, 2, HEADS, enc)
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=1)
    x = torch.randn(2, 17, DIM)
    out = model(x, layout)
    padded, x_padded = with_padding(layout, x, 4, torch.Generator().manual_seed(1), at=0.0)  # at (0, 0): a tie
    out_padded = model(x_padded, padded)
    torch.testing.assert_close(out_padded[:, :17], out, atol=1e-5, rtol=1e-5)

    out.square().sum().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    for block in model.blocks:
        assert block.attn.encoding.pos_emb.grad.abs().sum() > 0

    big = model(torch.randn(2, 1 + 8 * 9, DIM), PositionLayout.grid(2, (8, 9), num_prefix_tokens=1))
    assert torch.isfinite(big).all()  # 72 > npos_max - 1 = 16: positions clamp


def test_abspos_variant_reuses_abspos() -> None:
    enc = make(abspos=True)
    assert isinstance(enc.abspos, LearnableAbsolute)
    assert enc.claimed_principles() == {Principle.CONTEXT_AWARENESS}
    layout = PositionLayout.grid(1, (4, 4), num_prefix_tokens=1)
    x = torch.zeros(1, 17, DIM)
    torch.testing.assert_close(enc.embed(x, layout), enc.abspos.embed(x, layout))


def test_geometries() -> None:
    build("cope", Geometry(pos_dim=1), DIM, HEADS, 1)  # irregular 1-D: ordered by coordinate
    with pytest.raises(NotApplicableError):
        build("cope", Geometry(pos_dim=3), DIM, HEADS, 1)  # point clouds: no token order


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    n=st.integers(1, 40),
    axes=st.integers(1, 3),
    values=st.integers(1, 4),  # few distinct values per axis: ties across and within axes
    seed=st.integers(0, 2**16),
)
def test_lexicographic_ranks_count_the_counted_tokens_strictly_before(batch, n, axes, values, seed) -> None:
    """The sorted ranks equal the definition pair by pair: rank_m = #{counted t : r_t before r_m
    in lexicographic order}, ties sharing a rank, position-free tokens ranked but not counted."""
    from pe_bench.adapters.cope import lexicographic_ranks

    generator = torch.Generator().manual_seed(seed)
    coords = torch.randint(0, values, (batch, n, axes), generator=generator).float() - 1.5
    counted = torch.rand(batch, n, generator=generator) < 0.8
    a, b = coords.unsqueeze(2), coords.unsqueeze(1)  # (B, t, 1, P), (B, 1, m, P)
    before = a[..., -1] < b[..., -1]
    for axis in range(axes - 2, -1, -1):
        before = (a[..., axis] < b[..., axis]) | ((a[..., axis] == b[..., axis]) & before)
    expected = (before & counted[:, :, None]).sum(1)
    assert torch.equal(lexicographic_ranks(coords, counted), expected)


def test_ranks_are_computed_once_per_forward(monkeypatch) -> None:
    """The ranks depend on the key positions only: every CoPE layer of a forward reads one."""
    import pe_bench.adapters.cope as cope

    calls = []
    real = cope.lexicographic_ranks
    monkeypatch.setattr(cope, "lexicographic_ranks", lambda *args: calls.append(1) or real(*args))
    encoder = TransformerEncoder(DIM, 3, HEADS, build("cope", Geometry(pos_dim=2, grid_shape=(3, 4)), DIM, HEADS, 3))
    encoder(torch.randn(2, 12, DIM), PositionLayout.grid(2, (3, 4)))
    assert len(calls) == 1


@pytest.mark.parametrize("name", ["cope", "sape2"])
def test_counts_stay_float32_under_bf16_autocast(name) -> None:
    """A count sums up to Nk gates: in bf16 a count past 128 keeps no fraction for the
    interpolation and past 256 not its integer. The gates are made and counted in float32
    (SaPE²'s dense form too, as its Flex form always did), so under bf16 autocast the bias
    stays near the rounding of q and k themselves. CoPE, this configuration: 0.49 relative
    error with the counts in bf16 (CPU autocast keeps cumsum in bf16), 0.027 with bf16 gates
    summed in float32 (CUDA autocast runs cumsum in float32), 0.008 now. SaPE²'s counts run
    along one row, a gate per cell: its error was 0.004 before and after, a guard here."""
    torch.manual_seed(0)
    side, heads, width = 24, 4, 16
    n = side * side + 1
    layer = build(name, Geometry(pos_dim=2, grid_shape=(side, side), num_prefix_tokens=1), heads * width, heads, 1)
    layer = layer.make_layer(0)
    layout = PositionLayout.grid(1, (side, side), 1)
    x = torch.randn(1, n, heads * width)
    q, k = torch.randn(2, 1, heads, n, width).bfloat16().float()  # the same values in both runs
    inputs = AttentionInputs(x_q=x, x_k=x, query=layout, key=layout)
    with torch.no_grad():
        exact = layer.bias(q, k, inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = layer.bias(q.bfloat16(), k.bfloat16(), inputs)
    error = float((low.float() - exact).norm() / exact.norm())
    assert error < 0.015, error
