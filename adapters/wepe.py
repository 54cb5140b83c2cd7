"""WePE: Weierstrass elliptic Positional Encoding ("Weierstrass Positional Encoding for Vision
Transformers", arXiv 2605.23719, Section II-A/II-B), pre-training form.

For a patch in column c of W and row r of H:

1. normalised coordinates x = (c + 1/2) / W, y = (r + 1/2) / H in (0, 1) (Eq. 1): patch
   centres never sit on the pole at 0, and every grid size maps onto the same square, so
   a larger grid is just a denser sampling of the same field (resolution-agnostic);
2. z = alpha * omega_1 * x + i * beta * |omega_2| * y (Eq. 2), omega_1, omega_2 the real and
   imaginary half-periods, alpha = beta = 0.4 (the paper's default, Section III-F);
3. the lattice Lambda = {2 m omega_1 + 2 n omega_2}. It starts lemniscatic (g2 = 1, g3 = 0):
   a square with omega_1 = Gamma(1/4)^2 / (4 sqrt(pi)) (Theorem A.9). omega_1 stays fixed
   and |omega_2| = softplus(theta) is learnable (initialised to omega_1), so the square
   can become a rectangle (Section II-B, "Positional Encodings with Learnable Parameters");
4. wp(z)  = 1/z^2 + sum' [1/(z - l)^2 - 1/l^2],  wp'(z) = -2 sum 1/(z - l)^3 (Eq. 4), the
   sum over the ``num_terms`` nonzero lattice points of smallest modulus (the paper's
   modulus ordering, Eq. 6-9). The cut is widened to complete the last shell of equal
   modulus, so the truncated lattice keeps l -> -l symmetry: wp stays exactly even and
   wp' exactly odd, and for the square lattice the l -> i l symmetry keeps g3 = 0;
5. near a pole (|z - l| < ``pole_eps``) both values are replaced by ``pole_value``
   (Section II-B, numerical stability);
6. f = (Re wp, Im wp, Re wp', Im wp') compressed as tanh(s * f), s = softplus(.) learnable,
   initialised to 0.15 (Section III-F);
7. P = gamma * Linear(4 -> D)(f), gamma a learnable global scale (init 1), added to the
   patch tokens (Eq. 10).

``mode="lut"``: the raw field f (pole-clipped) is tabulated on a ``lut_size`` x ``lut_size``
grid over [0, 1]^2, sampled with bilinear ``grid_sample`` and then compressed, tanh(s f): the
order of the paper's Section III-B and Appendix E (WePE-LUT: the table holds "the computed
4-dimensional feature vectors", which then pass the tanh compression). During training the
table is rebuilt from the current parameters each step, so omega_2 still receives gradients
through it and s through the compression (its cost does not grow with batch or grid);
without gradients it is cached until omega_2 changes. Outside [0, 1]^2 the table clamps to
its border where direct mode keeps evaluating the periodic field. Measured against direct
mode at the default initialisation, on 14 x 14 and 24 x 24 grids: lut_size 128 errs by at
most 1.5e-3 (mean 2e-5), 256 by 1.1e-3 (mean 7e-6), 512 by 9e-5. Until stop 61 the table
held tanh(s f) instead, which turns steeply near the pole at the corner: 20-200x the error
(256: up to 0.11 at 24 x 24).

``span``: the paper's text has lost Eq. 2's symbols; it names alpha, beta "adjustable scaling
factors" and omega_1, omega_2 "the real half-period and imaginary half-period", read here as
z = alpha omega_1 x + i beta |omega_2| y (``span="half"``, the default: every shipped record
ran it). The paper's own sensitivity tables (Section III-F, a 14 x 14 patch grid) fit the
other reading, z spanning alpha of the whole period 2 omega (``span="full"``), measured here
(tests/adapters/test_enc_wepe.py, the correlation between patch distance and 1 - cosine
similarity of the compressed features, alpha = beta swept 0.2 ... 1.2):

    paper (Table "lattice scaling")   .613 .625 .620 .513 .347 .089
    span="full"                       .627 .621 .589 .507 .368 .078
    span="half"                       .612 .627 .615 .621 .631 .589

and the share of features below 0.02 over the tanh scale s = 0.01 ... 0.5 (paper 84.8 / 43.0 /
20.9 / 11.6 / 5.9 / 3.6 %): "full" 81.5 / 37.6 / 17.1 / 10.8 / 4.6 / 3.6, "half" 35.3 / 6.6 /
4.3 / 3.1 / 1.8 / 1.8. What neither reading reproduces: the paper's mean |feature| at the
defaults, 0.106 ("full" 0.190, "half" 0.506), and its saturated share, 1.91 % ("full": 3.6 %
above 0.99); so Eq. 2 is not settled, and ``span`` stays an option until it is.

CLS: the paper gives the classification token "a separate learnable encoding". This is
the one place the protocol's position-free CLS is satisfied by a dedicated embedding, not
a position: every token without a position (CLS, registers) receives the same learned
vector, which carries no coordinate information, as the paper does. Padding receives nothing.

WePE is an absolute encoding added to the input, so only the fused kernel is claimed: the
paper's "local attenuation" (Section II-D) is a property of encoding similarity inside one
period cell, which the learned q/k projections need not preserve in the attention logits.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from ._host import on_host
from .base import EncodingOptions, PositionEncoding, PositionLayout, Principle, init_truncated_normal
from .registry import register

#: real half-period of the lemniscatic lattice with g2 = 1, g3 = 0 (Theorem A.9).
LEMNISCATIC_OMEGA = math.gamma(0.25) ** 2 / (4.0 * math.sqrt(math.pi))


class WePEOptions(EncodingOptions):
    alpha: float = Field(0.4, gt=0.0)
    beta: float = Field(0.4, gt=0.0)
    num_terms: int = Field(120, ge=8)
    tanh_scale: float = Field(0.15, gt=0.0)
    pole_eps: float = Field(1e-4, gt=0.0)
    pole_value: float = 1e4
    mode: Literal["direct", "lut"] = "direct"
    lut_size: int = Field(256, ge=2)
    init_std: float = Field(0.02, ge=0.0)
    # How far alpha and beta are measured along the lattice (see the module docstring's "span"):
    # "half": z = alpha omega_1 x (+ i beta |omega_2| y), Eq. 2 as its text reads; "full":
    # twice that, alpha of the whole period, which reproduces the paper's Section III-F sweeps.
    span: Literal["half", "full"] = "half"


def inverse_softplus(value: float) -> float:
    return value + math.log(-math.expm1(-value))


def lattice_points(omega1: Tensor, omega2: Tensor, num_terms: int) -> Tensor:
    """Nonzero lattice points 2 m omega1 + 2 n omega2 ordered by modulus, complex (K,).

    omega1, omega2: complex scalars (half-periods). At least ``num_terms`` points: the cut
    is extended to the end of the shell of equal modulus it falls in, so the set is closed
    under l -> -l (and under the lattice's rotations). Differentiable in the half-periods;
    only the choice of points (an integer selection, ``lattice_indices``) is made without
    gradients.
    """
    index = lattice_indices(omega1.detach(), omega2.detach(), num_terms)
    return 2 * index[:, 0].to(omega1.dtype) * omega1 + 2 * index[:, 1].to(omega2.dtype) * omega2


@torch.compiler.disable
def lattice_indices(omega1: Tensor, omega2: Tensor, num_terms: int) -> Tensor:
    """(K, 2) integers (m, n) of the points ``lattice_points`` keeps, in its order.

    How many points complete the last shell depends on the learned half-period's value, so
    this runs eagerly (``torch.compiler.disable``): it is the one graph break of a compiled
    WePE model, made here on purpose rather than by Dynamo at every ``.item()`` below
    (tests/harness/test_compile.py checks that no other break exists). The search runs on
    the host, on one copy of both half-periods: on a GPU, each ``.item()`` on the device
    would wait for the queued kernels, five times per forward, where the copy waits once
    (tests/harness/test_host_sync.py); it has a few hundred candidates, too few for a GPU.
    """
    device = omega1.device
    with on_host(omega1, omega2) as (omega1, omega2):
        indices = _nearest_lattice_indices(omega1, omega2, num_terms)
    return indices.to(device)


def _nearest_lattice_indices(omega1: Tensor, omega2: Tensor, num_terms: int) -> Tensor:
    with torch.no_grad():
        p1, p2 = (2 * omega1).abs().item(), (2 * omega2).abs().item()
        # A disc holding num_terms points has radius ~ sqrt(K * cell area / pi); the box
        # spans it with a margin so that every point up to the cut is a candidate.
        area = abs((2 * omega1 * (2 * omega2).conj()).imag.item())
        radius = math.sqrt(num_terms * area / math.pi) * 1.5 + max(p1, p2)
        m_max, n_max = math.ceil(radius / p1) + 1, math.ceil(radius / p2) + 1
        m = torch.arange(-m_max, m_max + 1, device=omega1.device)
        n = torch.arange(-n_max, n_max + 1, device=omega1.device)
        mm, nn_ = torch.meshgrid(m, n, indexing="ij")
        mm, nn_ = mm.flatten(), nn_.flatten()
        keep = (mm != 0) | (nn_ != 0)
        mm, nn_ = mm[keep], nn_[keep]
        modulus = (2 * mm.to(omega1.dtype) * omega1 + 2 * nn_.to(omega2.dtype) * omega2).abs()
        order = torch.argsort(modulus, stable=True)
        cut = modulus[order[num_terms - 1]]
        count = int((modulus <= cut * (1 + 1e-9) + 1e-12).sum().item())
        return torch.stack([mm, nn_], dim=-1)[order[:count]]


def weierstrass(z: Tensor, lattice: Tensor, pole_eps: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """Truncated wp(z) and wp'(z) (Eq. 4) for complex z of any shape; lattice: (K,) nonzero.

    Also returns where z lies within ``pole_eps`` of a lattice point or 0. There every
    1/(z - l) is evaluated at a stand-in distance of 1, so the values are finite and no
    inf/NaN can reach a gradient; callers replace them (Section II-B's clipping).
    """
    shifted = z.unsqueeze(-1) - lattice
    near_terms = shifted.abs() < pole_eps
    near_origin = z.abs() < pole_eps
    inv = 1.0 / torch.where(near_terms, torch.ones_like(shifted), shifted)
    inv0 = 1.0 / torch.where(near_origin, torch.ones_like(z), z)
    inv2 = inv * inv
    # sum'(1/(z-l)^2 - 1/l^2): the constant sum 1/l^2 is formed once, not per point.
    wp = inv0 * inv0 + inv2.sum(-1) - (1.0 / lattice**2).sum()
    dwp = -2.0 * (inv0 * inv0 * inv0 + (inv2 * inv).sum(-1))
    return wp, dwp, near_origin | near_terms.any(-1)


def invariants(lattice: Tensor) -> tuple[Tensor, Tensor]:
    """g2 = 60 sum' l^-4 and g3 = 140 sum' l^-6 over the (truncated) lattice."""
    return 60.0 * (lattice**-4).sum(), 140.0 * (lattice**-6).sum()


@register("wepe")
class WeierstrassPE(PositionEncoding):
    principles = frozenset({Principle.FUSED_KERNEL})
    requires_grid = True
    pos_dims = frozenset({2})
    Options = WePEOptions
    # Eq. 1 divides patch centres by the current grid: every grid already spans (0, 1), and
    # positions scaled by train/test on top covered (0, train/test) of it (extrapolation: n/a).
    supports_position_interpolation = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        opts = self.options
        self.register_buffer("omega1", torch.tensor(LEMNISCATIC_OMEGA), persistent=False)
        self.omega2_raw = nn.Parameter(torch.tensor(inverse_softplus(LEMNISCATIC_OMEGA)))
        self.scale_raw = nn.Parameter(torch.tensor(inverse_softplus(opts.tanh_scale)))
        self.gamma = nn.Parameter(torch.tensor(1.0))
        self.proj = nn.Linear(4, self.dim)
        self.cls_embed = nn.Parameter(torch.zeros(self.dim))
        init_truncated_normal(self.cls_embed, opts.init_std)
        self._lut_cache: tuple[tuple, Tensor] | None = None

    # -- the elliptic field -------------------------------------------------------------
    def half_periods(self) -> tuple[Tensor, Tensor]:
        omega1 = self.omega1.to(torch.complex64)
        omega2 = 1j * F.softplus(self.omega2_raw).to(torch.complex64)
        return omega1, omega2

    def field(self, x: Tensor, y: Tensor) -> Tensor:
        """Compressed features tanh(s f) at normalised coordinates: (...), (...) -> (..., 4)."""
        return self.compress(self.raw_field(x, y))

    def compress(self, raw: Tensor) -> Tensor:
        """Section III-F: tanh(s f), s = softplus(.) learnable."""
        return torch.tanh(F.softplus(self.scale_raw) * raw)

    def raw_field(self, x: Tensor, y: Tensor) -> Tensor:
        """f = (Re wp, Im wp, Re wp', Im wp') at normalised coordinates, pole-clipped: (..., 4)."""
        opts = self.options
        omega1, omega2 = self.half_periods()
        lattice = lattice_points(omega1, omega2, opts.num_terms)
        reach = 2.0 if opts.span == "full" else 1.0  # periods 2 omega: "full" spans alpha of one
        z = reach * (opts.alpha * omega1 * x.to(torch.float32) + opts.beta * omega2 * y.to(torch.float32))
        wp, dwp, near_pole = weierstrass(z, lattice, opts.pole_eps)
        raw = torch.stack([wp.real, wp.imag, dwp.real, dwp.imag], dim=-1)
        # Section II-B: a point near a pole takes a large constant instead of the sum.
        return torch.where(near_pole.unsqueeze(-1), torch.full_like(raw, opts.pole_value), raw)

    def lut(self) -> Tensor:
        """(1, 4, S, S) table of the raw, pole-clipped field over [0, 1]^2 (rows: y, columns: x)."""
        key = (self.omega2_raw._version, self.omega2_raw.data_ptr(), self.omega2_raw.device)
        if not torch.is_grad_enabled() and self._lut_cache is not None and self._lut_cache[0] == key:
            return self._lut_cache[1]
        nodes = torch.linspace(0.0, 1.0, self.options.lut_size, device=self.omega2_raw.device)
        yy, xx = torch.meshgrid(nodes, nodes, indexing="ij")
        table = self.raw_field(xx, yy).permute(2, 0, 1).unsqueeze(0)
        if not torch.is_grad_enabled():
            self._lut_cache = (key, table)
        return table

    def features(self, x: Tensor, y: Tensor) -> Tensor:
        """Compressed features at normalised coordinates (B, N) each -> (B, N, 4)."""
        if self.options.mode == "direct":
            return self.field(x, y)
        table = self.lut()
        grid = torch.stack([2 * x - 1, 2 * y - 1], dim=-1).unsqueeze(0).to(table.dtype)  # (1, B, N, 2)
        b, n = x.shape
        sampled = F.grid_sample(
            table, grid.reshape(1, b * n, 1, 2), mode="bilinear", padding_mode="border", align_corners=True
        )
        return self.compress(sampled.reshape(4, b, n).permute(1, 2, 0))

    # -- protocol -----------------------------------------------------------------------
    def normalised(self, layout: PositionLayout) -> tuple[Tensor, Tensor]:
        """Eq. 1: (x, y) in (0, 1) from grid (row, col) over the layout's current grid."""
        if layout.grid_shape is None:
            raise ValueError("wepe needs layout.grid_shape: the task must describe its token grid")
        height, width = layout.grid_shape
        coords = layout.coords_or_zero(torch.float32)  # a CLS token's may be NaN: see embed
        return (coords[..., 1] + 0.5) / width, (coords[..., 0] + 0.5) / height

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        xn, yn = self.normalised(layout)
        patch = self.gamma * self.proj(self.features(xn, yn))
        valid = layout.valid if layout.valid is not None else torch.ones_like(layout.has_pos)
        # Selected by ``where``, not weighted by 0 and 1: a product would carry a NaN or inf
        # from either side into every token (cls_embed x 0) and into the gradients.
        on_patch = (layout.has_pos & valid).unsqueeze(-1)
        on_cls = (~layout.has_pos & valid).unsqueeze(-1)
        emb = torch.where(on_patch, patch, torch.where(on_cls, self.cls_embed.to(patch.dtype), 0.0))
        return x + emb.to(x.dtype)
