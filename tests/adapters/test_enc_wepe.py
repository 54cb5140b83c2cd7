"""WePE: the truncated Weierstrass function, LUT vs direct, CLS embedding, padding, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, Principle, build
from pe_bench.adapters.wepe import LEMNISCATIC_OMEGA, invariants, lattice_points, weierstrass
from pe_bench.harness.blocks import TransformerEncoder

DIM, HEADS = 32, 4
OMEGA = torch.tensor(LEMNISCATIC_OMEGA, dtype=torch.complex128)
# Points inside the fundamental cell [0, 2w]^2 (w ~ 1.854), away from its poles.
Z = torch.tensor([0.3 + 0.2j, 0.7 + 0.9j, 1.1 + 0.4j, 0.5 + 1.5j, 1.0 + 1.0j, 2.9 + 0.6j], dtype=torch.complex128)


def truncation_tolerance(lattice: torch.Tensor) -> float:
    """Relative error allowance for wp^3-sized quantities with lattice points up to radius R.

    The first omitted terms of wp are sum_{|l| > R} 3 z^2 / l^4 (the z / l^3 terms cancel in
    the l -> -l symmetric cut); bounding |l^-4| and comparing the sum with a planar integral
    (Eq. 8: density 1 / A per unit area, A the cell area) gives 3 |z|^2 pi / (A R^2). The
    residual (wp')^2 - 4 wp^3 + g2 wp involves wp up to the third power, hence the factor 3.
    """
    radius = lattice.abs().max().item()
    area = 4 * LEMNISCATIC_OMEGA**2
    return 3 * 3 * Z.abs().max().item() ** 2 * math.pi / (area * radius**2)


@pytest.mark.parametrize("terms", [400, 2000])
def test_lemniscatic_differential_equation(terms: int) -> None:
    """(wp')^2 = 4 wp^3 - g2 wp - g3 with the lemniscatic invariants g2 = 1, g3 = 0 (Eq. 37)."""
    lattice = lattice_points(OMEGA, 1j * OMEGA, terms)
    wp, dwp, near = weierstrass(Z, lattice)
    assert not near.any()
    residual = dwp**2 - (4 * wp**3 - 1.0 * wp)
    scale = dwp.abs() ** 2 + 4 * wp.abs() ** 3 + wp.abs()
    assert (residual.abs() / scale).max() < truncation_tolerance(lattice)


def test_truncation_converges_and_keeps_symmetry() -> None:
    coarse, fine = lattice_points(OMEGA, 1j * OMEGA, 100), lattice_points(OMEGA, 1j * OMEGA, 2000)

    def residual(lattice):
        wp, dwp, _ = weierstrass(Z, lattice)
        return ((dwp**2 - 4 * wp**3 + wp).abs() / (dwp.abs() ** 2 + 4 * wp.abs() ** 3)).max()

    assert residual(fine) < residual(coarse) / 10  # error falls at least like 1/K (Eq. 7-9)
    g2, g3 = invariants(fine)
    assert abs(g2.real.item() - 1.0) < 1e-4  # Theorem A.9's half-period gives g2 = 1
    assert abs(g3) < 1e-12  # complete shells keep the square's l -> i l symmetry exactly
    # Complete shells keep l -> -l: wp even, wp' odd, to round-off.
    wp, dwp, _ = weierstrass(Z, coarse)
    wp_neg, dwp_neg, _ = weierstrass(-Z, coarse)
    torch.testing.assert_close(wp_neg, wp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dwp_neg, -dwp, rtol=1e-12, atol=1e-12)
    # Double periodicity, within the truncation error of the shifted evaluation.
    lattice = lattice_points(OMEGA, 1j * OMEGA, 2000)
    wp, _, _ = weierstrass(Z, lattice)
    for period in (2 * OMEGA, 2j * OMEGA):
        shifted, _, _ = weierstrass(Z + period, lattice)
        assert ((shifted - wp).abs() / wp.abs()).max() < 1e-3


def make(grid=(5, 5), **options):
    return build("wepe", Geometry(pos_dim=2, grid_shape=grid, num_prefix_tokens=1), DIM, HEADS, 2, options)


def test_lut_equals_direct_on_table_nodes() -> None:
    """lut_size 101 puts nodes at multiples of 0.01, which include every 5 x 5 patch centre
    (0.1, 0.3, ..., 0.9): bilinear sampling then returns node values, up to float rounding
    of the sampling position (~1e-6 of a cell) times the field's jump across a cell (<= 2)."""
    enc = make(mode="lut", lut_size=101)
    with torch.no_grad():
        x, y = enc.normalised(PositionLayout.grid(2, (5, 5)))
        torch.testing.assert_close(enc.features(x, y), enc.field(x, y), atol=1e-4, rtol=0)


def test_lut_within_bilinear_error_bound() -> None:
    """The table holds the raw field f and the compression follows (Appendix E's order). Off the
    nodes, bilinear interpolation errs on f by at most h^2 / 8 (|f_xx| + |f_yy|) over the cell (h
    the node spacing), and tanh(s .) is s-Lipschitz; the second derivatives are estimated by
    second differences of the raw field with step h around each point, and doubled for their
    variation in a cell."""
    size = 128
    enc = make(mode="lut", lut_size=size)
    h = 1.0 / (size - 1)
    with torch.no_grad():
        x, y = enc.normalised(PositionLayout.grid(1, (24, 24)))
        direct, lut, raw = enc.field(x, y), enc.features(x, y), enc.raw_field(x, y)
        f_xx = (enc.raw_field(x + h, y) - 2 * raw + enc.raw_field(x - h, y)) / h**2
        f_yy = (enc.raw_field(x, y + h) - 2 * raw + enc.raw_field(x, y - h)) / h**2
        s = torch.nn.functional.softplus(enc.scale_raw)
    bound = s * h**2 / 8 * (f_xx.abs() + f_yy.abs())
    assert ((lut - direct).abs() <= 2 * bound + 1e-5).all()
    # compressing after the interpolation: 1.5e-3 at most here; the table of tanh(s f) erred by 0.1
    assert (lut - direct).abs().max() < 3e-3


def test_cls_gets_its_own_embedding_and_patches_are_resolution_agnostic() -> None:
    enc = make()
    layout = PositionLayout.grid(1, (5, 5), num_prefix_tokens=1)
    out = enc.embed(torch.zeros(1, 26, DIM), layout)
    torch.testing.assert_close(out[0, 0], enc.cls_embed.detach())
    moved = layout.with_coords(layout.coords.clone())
    moved.coords[:, 0] = torch.tensor([3.0, 4.0])  # a CLS "position" is ignored
    torch.testing.assert_close(enc.embed(torch.zeros(1, 26, DIM), moved), out)
    # Normalised coordinates: the centre patch of 5 x 5 and of 15 x 15 share (0.5, 0.5).
    big = enc.embed(torch.zeros(1, 226, DIM), PositionLayout.grid(1, (15, 15), num_prefix_tokens=1))
    torch.testing.assert_close(big[0, 1 + 7 * 15 + 7], out[0, 1 + 2 * 5 + 2])
    assert enc.claimed_principles() == {Principle.FUSED_KERNEL}


@pytest.mark.parametrize("mode", ["direct", "lut"])
def test_padding_gradients_and_larger_grid(mode: str) -> None:
    torch.manual_seed(0)
    # A small table keeps the per-step rebuild (training mode) cheap on CPU.
    enc = make(grid=(4, 4), mode=mode, lut_size=64)
    model = TransformerEncoder(DIM, 2, HEADS, enc)
    layout = PositionLayout.grid(2, (4, 4), num_prefix_tokens=1)
    x = torch.randn(2, 17, DIM)
    out = model(x, layout)
    pad = 3
    padded = PositionLayout(
        coords=torch.cat([layout.coords, torch.zeros(2, pad, 2)], 1),
        has_pos=torch.cat([layout.has_pos, torch.zeros(2, pad, dtype=torch.bool)], 1),
        valid=torch.cat([torch.ones(2, 17, dtype=torch.bool), torch.zeros(2, pad, dtype=torch.bool)], 1),
        grid_shape=(4, 4),
    )
    out_padded = model(torch.cat([x, torch.randn(2, pad, DIM)], 1), padded)
    torch.testing.assert_close(out_padded[:, :17], out, atol=1e-5, rtol=1e-5)

    out.square().sum().backward()
    names = {name for name, _ in enc.named_parameters()}
    assert names == {"omega2_raw", "scale_raw", "gamma", "proj.weight", "proj.bias", "cls_embed"}
    for name, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name

    model.eval()
    with torch.no_grad():
        big = model(torch.randn(2, 1 + 9 * 11, DIM), PositionLayout.grid(2, (9, 11), num_prefix_tokens=1))
    assert torch.isfinite(big).all()


def test_lut_cache_follows_parameters() -> None:
    enc = make(mode="lut", lut_size=33)
    with torch.no_grad():
        first = enc.lut()
        assert enc.lut() is first  # cached while nothing changes
        enc.omega2_raw.add_(0.3)  # in-place, as an optimiser step
        second = enc.lut()
    assert second is not first and not torch.allclose(second, first)


# --- the paper's Section III-F sensitivity tables: which reading of Eq. 2 they fit ---------------
PAPER_ALPHA_SWEEP = {0.2: 0.613, 0.4: 0.625, 0.6: 0.620, 0.8: 0.513, 1.0: 0.347, 1.2: 0.089}  # distance corr.
PAPER_NEAR_ZERO = {0.01: 84.82, 0.05: 42.98, 0.1: 20.92, 0.15: 11.61, 0.3: 5.87, 0.5: 3.57}  # % by tanh scale


def _paper_grid_features(**options) -> tuple[torch.Tensor, torch.Tensor]:
    """Compressed features (196, 4) of a 14 x 14 patch grid (the paper's ViT at 224² / 16), and
    the patches' normalised centres (196, 2)."""
    encoding = build("wepe", Geometry(pos_dim=2, grid_shape=(14, 14), num_prefix_tokens=0), DIM, HEADS, 1, options)
    rows, cols = torch.meshgrid(torch.arange(14.0), torch.arange(14.0), indexing="ij")
    x, y = (cols.flatten() + 0.5) / 14, (rows.flatten() + 0.5) / 14
    with torch.no_grad():
        return encoding.field(x, y).double(), torch.stack([x, y], -1).double()


def _distance_correlation(features: torch.Tensor, centres: torch.Tensor) -> float:
    """Pearson's r over all patch pairs between their distance and 1 - the cosine similarity of
    their features (Section III-F's "positional-encoding dissimilarity")."""
    unit = features / features.norm(dim=-1, keepdim=True)
    pairs = torch.triu_indices(len(centres), len(centres), 1)
    distance = torch.cdist(centres, centres)[pairs[0], pairs[1]]
    dissimilarity = (1 - unit @ unit.T)[pairs[0], pairs[1]]
    return torch.corrcoef(torch.stack([distance, dissimilarity]))[0, 1].item()


def test_full_span_fits_the_papers_alpha_sweep_and_half_span_does_not() -> None:
    """The text of Eq. 2 is lost; the paper's sweep of alpha = beta is reproduced by z spanning
    alpha of the whole period (span="full") within 0.04 everywhere, while the half-period
    reading keeps its distance decay where the paper's collapses (alpha >= 1)."""
    for alpha, paper in PAPER_ALPHA_SWEEP.items():
        full = _distance_correlation(*_paper_grid_features(alpha=alpha, beta=alpha, span="full"))
        assert abs(full - paper) < 0.04, (alpha, full, paper)
    half = _distance_correlation(*_paper_grid_features(alpha=1.2, beta=1.2, span="half"))
    assert half - PAPER_ALPHA_SWEEP[1.2] > 0.4  # the check can fail: half keeps r ~ 0.59


def test_full_span_fits_the_papers_near_zero_share_by_tanh_scale() -> None:
    """Share of compressed features below 0.02 at alpha = beta = 0.4 for each tanh scale s."""
    for scale, paper in PAPER_NEAR_ZERO.items():
        features, _ = _paper_grid_features(tanh_scale=scale, span="full")
        share = 100 * (features.abs() < 0.02).double().mean().item()
        assert abs(share - paper) < 7.0, (scale, share, paper)
    features, _ = _paper_grid_features(tanh_scale=0.01, span="half")
    assert PAPER_NEAR_ZERO[0.01] - 100 * (features.abs() < 0.02).double().mean().item() > 40


def test_span_doubles_the_reach_of_alpha() -> None:
    """span="full" at alpha is span="half" at 2 alpha (the same z), in both modes."""
    for mode in ("direct", "lut"):
        full, _ = _paper_grid_features(alpha=0.3, beta=0.2, span="full", mode=mode)
        half, _ = _paper_grid_features(alpha=0.6, beta=0.4, span="half", mode=mode)
        torch.testing.assert_close(full, half)
