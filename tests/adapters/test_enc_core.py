"""Math of the foundation encodings: PaPE's two forms, RoPE's relativity, CAPE, abspos, sincos."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import Geometry, PositionLayout, build
from pe_bench.adapters.transforms import mean_normalize
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.conformance.probes import (
    LAYER_DIM,
    LAYER_HEADS,
    efficient_and_explicit,
    make_attention,
    random_layout,
)


@settings(max_examples=15, deadline=None)
@given(
    pos_dim=st.integers(1, 3),
    m=st.integers(1, 12),
    n=st.integers(2, 12),
    prefix=st.integers(0, 2),
    seed=st.integers(0, 10_000),
    variant=st.sampled_from(
        [{}, {"quadratic": False}, {"linear": False}, {"context": False}, {"softplus": False}, {"project": False}]
    ),
)
def test_pape_efficient_form_equals_explicit_bias(pos_dim, m, n, prefix, seed, variant):
    """Eq. 13-14 (our narrower factorisation) reproduce Eq. 9 exactly, for every ablation."""
    efficient, explicit = efficient_and_explicit("pape", pos_dim, {"m": m, **variant})
    layout, x = random_layout(2, n, pos_dim, prefix=prefix, seed=seed)
    torch.testing.assert_close(efficient.logits(x, layout), explicit.logits(x, layout), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(efficient(x, layout), explicit(x, layout), rtol=1e-9, atol=1e-9)


def test_pape_forms_agree_in_cross_attention_with_padding():
    efficient, explicit = efficient_and_explicit("pape", 2, {"m": 6}, cross=True)
    query, xq = random_layout(2, 4, 2, prefix=1, seed=3)
    key, xk = random_layout(2, 9, 2, seed=4)
    key.valid = torch.ones(2, 9, dtype=torch.bool)
    key.valid[1, 6:] = False
    out_e = efficient(xq, query, context=xk, key=key)
    out_x = explicit(xq, query, context=xk, key=key)
    torch.testing.assert_close(out_e, out_x, rtol=1e-9, atol=1e-9)


def test_pape_bias_matches_equation_9_by_hand():
    """One head, m = 1, P = 1: bias = (a Δ² + b Δ)/sqrt(h) with Δ = w (r_j - r_i)."""
    attn = make_attention("pape", 1, {"m": 1, "form": "explicit"})
    layer = attn.encoding
    layout, x = random_layout(1, 4, 1, seed=5)
    a, b = layer.coefficients(x)
    w = layer.w_p[:, 0, 0]  # (H,)
    r = layout.coords[0, :, 0].double()
    delta = w[:, None, None] * (r[None, None, :] - r[None, :, None])  # (H, Nq, Nk)
    expected = (a[0, :, :, :1] * delta**2 + b[0, :, :, :1] * delta) / math.sqrt(LAYER_DIM // LAYER_HEADS)
    inputs = _inputs(x, layout)
    torch.testing.assert_close(
        layer.bias(torch.zeros(1, LAYER_HEADS, 4, LAYER_DIM // LAYER_HEADS), None, inputs)[0], expected
    )


def _inputs(x, layout):
    from pe_bench.adapters import AttentionInputs

    return AttentionInputs(x_q=x, x_k=x, query=layout, key=layout)


def test_pape_widens_heads_by_2m_plus_1_padded_to_8():
    attn = make_attention("pape", 2, {"m": 5})
    layout, x = random_layout(1, 7, 2)
    q = torch.randn(1, LAYER_HEADS, 7, LAYER_DIM // LAYER_HEADS, dtype=torch.float64)
    q2, k2 = attn.encoding.transform_qk(q, q.clone(), _inputs(x, layout))
    width = LAYER_DIM // LAYER_HEADS + 2 * 5 + 1
    assert q2.shape[-1] == k2.shape[-1] == width + (-width % 8)


def test_pape_a_is_negative_so_distance_decays():
    attn = make_attention("pape", 2, {"m": 4})
    a, _ = attn.encoding.coefficients(torch.randn(3, 10, LAYER_DIM, dtype=torch.float64))
    assert (a < 0).all()


@pytest.mark.parametrize("linear", [False, True])
def test_pape_without_linear_term_cannot_tell_a_layout_from_its_point_reflection(linear):
    """Without b the bias is even in the offset, so a whole ViT with a position-free CLS gives
    the same output for a layout and its point reflection (r -> -r, contents kept). On the
    imagenet stand-in the reflection maps direction sector k to k + 4, hence a ceiling of
    50 % for pape[linear=false] (README, PaPE Tables 2 and 3). The full PaPE tells them apart."""
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=(4, 4), num_prefix_tokens=1)
    enc = build("pape", geometry, LAYER_DIM, LAYER_HEADS, 2, {"m": 4, "linear": linear})
    model = TransformerEncoder(LAYER_DIM, 2, LAYER_HEADS, enc).double()
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=1)
    reflected = layout.with_coords(-layout.coords)
    x = torch.randn(2, 17, LAYER_DIM, dtype=torch.float64)
    with torch.no_grad():
        cls, cls_reflected = model(x, layout)[:, 0], model(x, reflected)[:, 0]
    if linear:
        assert (cls - cls_reflected).abs().max() > 1e-3
    else:
        torch.testing.assert_close(cls, cls_reflected, rtol=1e-9, atol=1e-9)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), pos_dim=st.integers(1, 3), shift=st.floats(-50, 50))
def test_rope_scores_depend_only_on_relative_position(seed, pos_dim, shift):
    attn = make_attention("rope", pos_dim, {"base": 100.0})
    layout, x = random_layout(2, 9, pos_dim, seed=seed)
    moved = layout.with_coords(layout.coords + shift)
    torch.testing.assert_close(attn.logits(x, moved), attn.logits(x, layout), rtol=1e-7, atol=1e-7)


def test_rope_equals_explicit_rotation_formula():
    """1-D, one rotation pair per frequency: q_i.k_j rotated = Re(q_c conj(k_c) e^{i θ (r_i - r_j)})."""
    attn = make_attention("rope", 1, {"base": 10.0})
    layout, _ = random_layout(1, 5, 1, seed=7)
    q = torch.randn(1, LAYER_HEADS, 5, LAYER_DIM // LAYER_HEADS, dtype=torch.float64)
    k = torch.randn(1, LAYER_HEADS, 5, LAYER_DIM // LAYER_HEADS, dtype=torch.float64)
    rq, rk = attn.encoding.transform_qk(q, k, _inputs(torch.zeros(1, 5, LAYER_DIM, dtype=torch.float64), layout))
    freqs = attn.encoding.frequencies[0].double()  # (F,)
    qc = torch.view_as_complex(q.unflatten(-1, (-1, 2)).contiguous())
    kc = torch.view_as_complex(k.unflatten(-1, (-1, 2)).contiguous())
    r = layout.coords[0, :, 0].double()
    phase = torch.exp(1j * freqs[None, None, :] * (r[:, None, None] - r[None, :, None]))  # (Nq, Nk, F)
    expected = torch.einsum("bhif,bhjf,ijf->bhij", qc, kc.conj(), phase).real
    torch.testing.assert_close(rq @ rk.transpose(-1, -2), expected)


def test_cape_is_mean_normalisation_only_in_eval_mode():
    geometry = Geometry(pos_dim=2, grid_shape=(4, 6), num_prefix_tokens=1)
    cape = build("cape", geometry, LAYER_DIM, LAYER_HEADS, 1).eval()
    layout = PositionLayout.grid(2, (4, 6), 1)
    prepared = cape.prepare(layout)
    unit = layout.coords * torch.tensor([2 / 3, 2 / 5]) - 1  # CAPE's linspace(-1, 1, n) per axis
    expected = mean_normalize(layout.with_coords(unit)).coords
    torch.testing.assert_close(prepared.coords[:, 1:], expected[:, 1:])
    assert prepared.coords[:, 1:].mean(1).abs().max() < 1e-6


def test_cape_coordinate_scale_multiplies_the_centred_positions_before_augmentation():
    geometry = Geometry(pos_dim=3, grid_shape=None)
    raw = build("cape", geometry, LAYER_DIM, LAYER_HEADS, 1).eval()
    scaled = build("cape", geometry, LAYER_DIM, LAYER_HEADS, 1, {"coordinate_scale": 0.1}).eval()
    coords = torch.randn(2, 9, 3, generator=torch.Generator().manual_seed(0)) * 10 + 4
    layout = PositionLayout(coords=coords, has_pos=torch.ones(2, 9, dtype=torch.bool))
    expected = mean_normalize(layout).coords * 0.1
    torch.testing.assert_close(scaled.prepare(layout).coords, expected)
    torch.testing.assert_close(scaled.prepare(layout).coords, raw.prepare(layout.with_coords(coords * 0.1)).coords)
    # Training: the augmentation acts on the scaled positions, so Δmax = 0.5 is in the new units
    # (shifted before scaling, no global shift could exceed 0.05).
    scaled.train()
    scaled.generator = torch.Generator().manual_seed(0)
    many = PositionLayout(coords=coords.repeat(32, 1, 1), has_pos=torch.ones(64, 9, dtype=torch.bool))
    shift = scaled.prepare(many).coords.mean(1)  # off-grid: no local shift, so the mean is λΔ
    assert 0.2 < shift.abs().max() <= 0.5 * 1.4 + 1e-6
    # Grid positions are already on CAPE's [-1, 1]: the scale leaves them alone.
    grid = Geometry(pos_dim=2, grid_shape=(4, 6))
    on_grid = PositionLayout.grid(1, (4, 6))
    plain = build("cape", grid, LAYER_DIM, LAYER_HEADS, 1).eval().prepare(on_grid).coords
    with_scale = build("cape", grid, LAYER_DIM, LAYER_HEADS, 1, {"coordinate_scale": 0.1}).eval().prepare(on_grid)
    torch.testing.assert_close(with_scale.coords, plain)


def test_cape_coordinate_scale_per_axis():
    """One scale per axis maps each to [-1, 1] on its own (CAPE Figure 1 does so for an
    image's two axes); the count must match the positions' axes."""
    geometry = Geometry(pos_dim=3, grid_shape=None)
    cape = build("cape", geometry, LAYER_DIM, LAYER_HEADS, 1, {"coordinate_scale": [0.5, 0.25, 0.01]}).eval()
    coords = torch.randn(2, 7, 3, generator=torch.Generator().manual_seed(1)) * torch.tensor([2.0, 4.0, 100.0])
    layout = PositionLayout(coords=coords, has_pos=torch.ones(2, 7, dtype=torch.bool))
    expected = mean_normalize(layout).coords * torch.tensor([0.5, 0.25, 0.01])
    torch.testing.assert_close(cape.prepare(layout).coords, expected)
    with pytest.raises(ValueError, match="coordinate_scale has 2 entries, the task's positions have 3 axes"):
        build("cape", geometry, LAYER_DIM, LAYER_HEADS, 1, {"coordinate_scale": [0.5, 0.25]})


def test_cape_training_augmentation_stays_within_its_bounds():
    geometry = Geometry(pos_dim=1, grid_shape=None)
    cape = build(
        "cape", geometry, LAYER_DIM, LAYER_HEADS, 1, {"max_global_shift": 0.5, "max_local_shift": 0.1, "max_scale": 1.4}
    )
    cape.train()
    cape.generator = torch.Generator().manual_seed(0)
    coords = torch.linspace(-3, 3, 50).reshape(1, 50, 1).expand(400, -1, -1).clone()
    layout = PositionLayout(coords=coords, has_pos=torch.ones(400, 50, dtype=torch.bool))
    out = cape.prepare(layout).coords
    scale = (out[:, -1] - out[:, 0]) / 6  # λ (1 + (ε_last - ε_first)/6)
    assert scale.min() > 1 / 1.4 * (1 - 0.2 / 6) - 1e-6 and scale.max() < 1.4 * (1 + 0.2 / 6) + 1e-6
    assert scale.std() > 0.05  # the scale really varies across sequences
    assert (out.mean(1).abs() / scale).max() < (0.5 + 0.1) / (1 - 0.2 / 6) + 1e-5  # |Δ + mean ε| <= Δmax + εmax


def test_cape_on_a_grid_in_raw_units_asks_for_its_local_shift():
    """The paper's εmax = 1/N is in [-1, 1] units (about half a grid step); applied to raw
    coordinates it would be a tenth of a step at N = 10: an error naming the option, not that."""
    geometry = Geometry(pos_dim=1, grid_shape=(10,))
    layout = PositionLayout.grid(2, (10,))
    cape = build("cape", geometry, LAYER_DIM, LAYER_HEADS, 1, {"coordinates": "raw"}).train()
    with pytest.raises(ValueError, match="max_local_shift"):
        cape.prepare(layout)
    explicit = build("cape", geometry, LAYER_DIM, LAYER_HEADS, 1, {"coordinates": "raw", "max_local_shift": 0.5})
    assert explicit.train().prepare(layout).coords.shape == layout.coords.shape
    assert build("cape", geometry, LAYER_DIM, LAYER_HEADS, 1).train().prepare(layout).coords.abs().max() < 3


def test_cape_two_dim_frequencies_follow_eq_4():
    cape = build("cape", Geometry(pos_dim=2, grid_shape=(3, 3)), 8, 2, 1)
    k = torch.arange(4, dtype=torch.float32)
    rho = 10 ** ((k + 1) / 4)
    expected = math.pi * torch.stack([rho * torch.cos(k), rho * torch.sin(k)], dim=-1)
    torch.testing.assert_close(cape.frequencies, expected)


@pytest.mark.parametrize("pos_dim", [2, 3])
def test_cape_axes_directions_give_each_component_one_coordinate(pos_dim):
    """`directions: axes` keeps CAPE's frequency ladder but puts frequency k on axis k mod P:
    moving one coordinate changes only that axis's components. The paper's hatching mixes
    the axes in every component (the contrast the scannet ablation measures)."""
    geometry = Geometry(pos_dim=pos_dim, grid_shape=None)
    axes = build("cape", geometry, 12, 2, 1, {"directions": "axes"}).eval()
    hatching = build("cape", geometry, 12, 2, 1).eval()
    half = 6
    rho = 10 ** (torch.arange(1, half + 1, dtype=torch.float32) / half)
    torch.testing.assert_close(axes.frequencies.norm(dim=-1), math.pi * rho)
    torch.testing.assert_close(hatching.frequencies.norm(dim=-1), math.pi * rho)
    coords = torch.randn(1, 5, pos_dim, generator=torch.Generator().manual_seed(0))
    has_pos = torch.ones(1, 5, dtype=torch.bool)
    for axis in range(pos_dim):
        moved = coords.clone()
        moved[..., axis] += 0.37
        features = {}
        for name, cape in (("axes", axes), ("hatching", hatching)):
            x = torch.zeros(1, 5, 12)
            before = cape.embed(x, PositionLayout(coords=coords, has_pos=has_pos))
            after = cape.embed(x, PositionLayout(coords=moved, has_pos=has_pos))
            features[name] = (after - before).abs().amax(dim=(0, 1)) > 1e-6  # components that changed
        on_axis = (torch.arange(half) % pos_dim == axis).repeat(2)  # [cos | sin] halves
        assert torch.equal(features["axes"], on_axis)
        # Every hatching component after the first (k = 0 lies in the x-z or x plane) mixes every axis.
        assert features["hatching"].view(2, half)[:, 1:].all()


def test_abspos_resizes_bicubically_and_is_exact_on_its_own_grid():
    geometry = Geometry(pos_dim=2, grid_shape=(4, 4), num_prefix_tokens=1)
    abspos = build("abspos", geometry, LAYER_DIM, LAYER_HEADS, 1)
    x = torch.zeros(1, 17, LAYER_DIM)
    same = abspos.embed(x, PositionLayout.grid(1, (4, 4), 1))
    torch.testing.assert_close(same[0, 1:], abspos.table.flatten(2)[0].T)
    assert same[0, 0].abs().max() == 0  # CLS gets no positional vector
    bigger = abspos.embed(torch.zeros(1, 65, LAYER_DIM), PositionLayout.grid(1, (8, 8), 1))
    expected = torch.nn.functional.interpolate(abspos.table, size=(8, 8), mode="bicubic", align_corners=False)
    torch.testing.assert_close(bigger[0, 1:], expected.flatten(2)[0].T)


def test_sincos_splits_channels_across_axes():
    sincos = build("sincos", Geometry(pos_dim=2, grid_shape=(3, 3)), 8, 2, 1)
    coords = torch.tensor([[[1.0, 2.0]]])
    feats = sincos.features(coords)[0, 0]
    f = torch.tensor([1.0, 0.01])  # base 10000, 2 frequencies per axis
    expected = torch.cat([torch.cos(1 * f), torch.sin(1 * f), torch.cos(2 * f), torch.sin(2 * f)])
    torch.testing.assert_close(feats, expected)


@pytest.mark.parametrize("name", ["nopos", "sincos", "abspos", "rope", "pape", "cape"])
def test_foundation_encodings_build_in_a_vit_and_run_at_another_resolution(name):
    from pe_bench.adapters import EncodingFactory
    from pe_bench.harness.config import ModelConfig
    from pe_bench.tasks._shared.vit import ViT, image_geometry

    config = ModelConfig(dim=32, depth=2, num_heads=4, patch_size=4)
    make_encoding = EncodingFactory(name, {"m": 4} if name == "pape" else {})
    model = ViT(make_encoding, image_geometry((16, 16), 4), config, 3, 5).eval()
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 5)
    assert torch.isfinite(model(torch.randn(1, 3, 24, 32))).all()  # non-square, larger grid


@pytest.mark.parametrize("name", ["alibi", "lookhere", "relpos"])
def test_grid_bias_is_built_once_for_the_batch_and_changes_nothing(name):
    """A grid layout is shared by every sample (expanded): position-only biases are built for
    one sample and broadcast; the attention equals that of per-sample copies of the layout."""
    from pe_bench.adapters.base import AttentionInputs
    from pe_bench.harness.conformance.probes import make_attention

    shared = PositionLayout.grid(3, (4, 5), num_prefix_tokens=1)
    shared = shared.with_coords(shared.coords[:1].double().expand(3, -1, -1))  # still one grid for all
    copies = PositionLayout(coords=shared.coords.clone(), has_pos=shared.has_pos.clone(), grid_shape=(4, 5))
    attn = make_attention(name, 2, grid_shape=(4, 5))
    x = torch.randn(3, 21, attn.qkv.in_features, dtype=torch.float64)
    layer = attn.encoding
    assert layer.bias(None, None, AttentionInputs(x_q=x, x_k=x, query=shared, key=shared)).shape[0] == 1
    per_sample = layer.bias(None, None, AttentionInputs(x_q=x, x_k=x, query=copies, key=copies))
    assert per_sample.shape[0] == 3
    torch.testing.assert_close(attn(x, shared), attn(x, copies), rtol=0, atol=0)


def test_masked_mean_ignores_whatever_the_mask_leaves_out():
    """NaN * 0 is NaN: the mean key position (every centred encoding's origin) must leave the
    coordinates of tokens without a position out, not weigh them by 0."""
    from pe_bench.adapters.base import masked_mean

    coords = torch.tensor([[[1.0], [float("nan")], [3.0]], [[float("inf")], [4.0], [0.0]]])
    mask = torch.tensor([[True, False, True], [False, True, False]])
    assert torch.equal(masked_mean(coords, mask), torch.tensor([[[2.0]], [[4.0]]]))
    assert torch.equal(masked_mean(coords, torch.zeros(2, 3, dtype=torch.bool)), torch.zeros(2, 1, 1))
