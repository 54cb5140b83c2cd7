"""What the conformance suite runs an encoding on: probe geometries, small models, layouts.

Encoder probes (the suite itself) are small random
:class:`~pe_bench.harness.blocks.TransformerEncoder` models on CPU: width ``DIM`` = 64,
``HEADS`` = 4 heads of 16 channels, depth ``DEPTH`` = 2, MLP ratio 2, eval mode (so
training-only augmentation such as CAPE's is off), batches of ``BATCH`` = 2, built for one
of the probe geometries in ``PROBES``:

* ``grid2d+cls``: a 5 x 5 grid of patches (P = 2, coordinates 0..4 per axis) after one CLS
  token; larger 8 x 8, queries 3 x 3 (+ CLS);
* ``seq1d``:      a 16-token sequence (P = 1, a 1-D grid of 16 cells); larger 40, queries 7;
* ``points3d``:   20 irregular points uniform in a 4 x 4 x 4 m box (P = 3, no grid); larger
  60 points in an 8 m box, queries 9 points in the 4 m box.

Layer probes (paper-specific tests of one encoding) are single float64 attention layers of
width ``LAYER_DIM`` = 32 with ``LAYER_HEADS`` = 4, on random irregular layouts, with
assertions that padding is inert, prefix tokens are position-free and every parameter learns.
Plug-in encodings can reuse them in their own tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from pe_bench.adapters import build
from pe_bench.adapters.base import EncodingOptions, Geometry, PositionEncoding, PositionLayout, masked_mean

from ..attention import Attention
from ..blocks import TransformerEncoder

DIM = 64
HEADS = 4
DEPTH = 2
BATCH = 2
#: Weight seeds of the encoder probes; each seed also draws fresh contents and transforms.
SEEDS = (0, 1, 2)
#: Padding tokens appended by :func:`with_padding` in the suite.
PAD_TOKENS = 3

LAYER_DIM = 32
LAYER_HEADS = 4

__all__ = [
    "BATCH",
    "DEPTH",
    "DIM",
    "HEADS",
    "LAYER_DIM",
    "LAYER_HEADS",
    "PAD_TOKENS",
    "PROBES",
    "SEEDS",
    "Probe",
    "assert_all_parameters_learn",
    "assert_cls_position_free",
    "assert_padding_inert",
    "build_model",
    "collapse",
    "efficient_and_explicit",
    "make_attention",
    "plain_copy",
    "random_layout",
    "randomise_encoding",
    "random_rotation",
    "random_shift",
    "rotate",
    "run_safely",
    "shift",
    "with_padding",
]


# --------------------------------------------------------------------------- encoder probes


@dataclass(frozen=True)
class Probe:
    """One probe geometry: how to lay out tokens at build size, larger, and as queries.

    Grid probes (``grid`` set) give the same regular layout every time; point probes draw
    ``points`` positions uniformly in an ``extent``-sized box from the generator.
    """

    key: str
    geometry: Geometry
    description: str
    grid: tuple[int, ...] | None = None
    larger_grid: tuple[int, ...] | None = None
    query_grid: tuple[int, ...] | None = None
    points: int = 0
    larger_points: int = 0
    query_points: int = 0
    extent: float = 4.0

    def _grid(self, batch: int, grid: tuple[int, ...]) -> PositionLayout:
        layout = PositionLayout.grid(batch, grid, self.geometry.num_prefix_tokens)
        return layout.with_coords(layout.coords.contiguous())

    def _points(self, batch: int, n: int, extent: float, gen: torch.Generator) -> PositionLayout:
        coords = torch.rand(batch, n, self.geometry.pos_dim, generator=gen) * extent
        return PositionLayout(coords=coords, has_pos=torch.ones(batch, n, dtype=torch.bool))

    def layout(self, batch: int, gen: torch.Generator) -> PositionLayout:
        """The layout the encoding is built for."""
        if self.grid is not None:
            return self._grid(batch, self.grid)
        return self._points(batch, self.points, self.extent, gen)

    def larger_layout(self, batch: int, gen: torch.Generator) -> PositionLayout:
        """More tokens than the encoding was built for (points also spread over twice the extent)."""
        if self.larger_grid is not None:
            return self._grid(batch, self.larger_grid)
        return self._points(batch, self.larger_points, 2 * self.extent, gen)

    def query_layout(self, batch: int, gen: torch.Generator) -> PositionLayout:
        """Fewer tokens than :meth:`layout`: the queries of the cross-attention check."""
        if self.query_grid is not None:
            return self._grid(batch, self.query_grid)
        return self._points(batch, self.query_points, self.extent, gen)


PROBES: tuple[Probe, ...] = (
    Probe(
        "grid2d+cls",
        Geometry(pos_dim=2, grid_shape=(5, 5), units="patch", num_prefix_tokens=1),
        "P=2, 5x5 grid after 1 CLS token",
        grid=(5, 5),
        larger_grid=(8, 8),
        query_grid=(3, 3),
    ),
    Probe(
        "seq1d",
        Geometry(pos_dim=1, grid_shape=(16,), units="token"),
        "P=1, 16-token sequence",
        grid=(16,),
        larger_grid=(40,),
        query_grid=(7,),
    ),
    Probe(
        "points3d",
        Geometry(pos_dim=3, grid_shape=None, units="m"),
        "P=3, 20 irregular points",
        points=20,
        larger_points=60,
        query_points=9,
    ),
)


def build_model(
    cls: type[PositionEncoding],
    probe: Probe,
    options: Mapping[str, Any] | EncodingOptions | None,
    seed: int,
    randomise: bool = False,
) -> TransformerEncoder:
    """The encoder probe of ``cls`` for ``probe``'s geometry, weights seeded by ``seed``, in eval mode.

    Seeds the global torch generator (the caller forks it): encodings draw their
    initialisation from it. With ``randomise`` every trainable floating-point parameter of
    the encoding (model level and per layer) then gets p + N(0, s^2), s = max(0.1, std p),
    so that positional paths that are zero or tiny at initialisation (a zero-initialised
    projection, Cayley-STRING's S = 0) are exercised.
    """
    torch.manual_seed(seed)
    if not isinstance(options, EncodingOptions):
        options = cls.Options(**dict(options or {}))
    encoding = cls(geometry=probe.geometry, dim=DIM, num_heads=HEADS, depth=DEPTH, options=options)
    model = TransformerEncoder(DIM, DEPTH, HEADS, encoding, mlp_ratio=2.0)
    if randomise:
        randomise_encoding(model, seed)
    return model.eval()


def randomise_encoding(model: TransformerEncoder, seed: int) -> None:
    """Perturb every trainable floating-point encoding parameter: p + N(0, max(0.1, std p)^2)."""
    params = {id(p): p for p in model.encoding.parameters()}
    for block in model.blocks:
        if block.attn.encoding is not None:
            params.update((id(p), p) for p in block.attn.encoding.parameters())
    gen = torch.Generator().manual_seed(500 + seed)
    with torch.no_grad():
        for p in params.values():
            if p.is_floating_point() and p.requires_grad:
                scale = max(0.1, p.float().std().item() if p.numel() > 1 else 0.0)
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)


def run_safely(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """(result, None), or (None, "ExceptionType: message") when ``fn`` raises."""
    try:
        return fn(), None
    except Exception as err:  # a conformance suite reports crashes, it does not propagate them
        return None, f"{type(err).__name__}: {err}"


# --------------------------------------------------------------------------- layout transforms


def shift(layout: PositionLayout, t: Tensor) -> PositionLayout:
    """Every positioned token moved by ``t`` (P,); position-free tokens keep their coordinates."""
    mask = layout.has_pos.unsqueeze(-1).to(layout.coords.dtype)
    return layout.with_coords(layout.coords + t.to(layout.coords.dtype) * mask)


def rotate(layout: PositionLayout, rotation: Tensor) -> PositionLayout:
    """Positioned tokens rotated by ``rotation`` (P, P) about their centroid."""
    centre = masked_mean(layout.coords, layout.positioned)
    rotated = centre + (layout.coords - centre) @ rotation.T.to(layout.coords.dtype)
    return layout.with_coords(torch.where(layout.has_pos.unsqueeze(-1), rotated, layout.coords))


def collapse(layout: PositionLayout) -> PositionLayout:
    """Every positioned token at the centroid: all relative offsets zero."""
    centre = masked_mean(layout.coords, layout.positioned).expand_as(layout.coords)
    return layout.with_coords(torch.where(layout.has_pos.unsqueeze(-1), centre, layout.coords))


def random_shift(pos_dim: int, gen: torch.Generator, grid: bool = False) -> Tensor:
    """A translation (P,): t ~ N(0, 3^2) per axis, or with ``grid`` a non-zero integer vector
    in [-3, 3]^P (a shift of the grid's coordinate frame)."""
    if grid:
        t = torch.randint(-3, 4, (pos_dim,), generator=gen).float()
        if not t.any():
            t[0] = 2.0
        return t
    return torch.randn(pos_dim, generator=gen) * 3.0


def random_rotation(pos_dim: int, gen: torch.Generator, grid: bool = False) -> Tensor:
    """A random element of SO(P), float64 (QR of a Gaussian matrix, det fixed to +1); with
    ``grid`` a random non-trivial multiple of 90 degrees (P = 2), which maps a square grid
    onto itself about its centre."""
    if grid:
        if pos_dim != 2:
            raise ValueError(f"quarter-turn rotations of a grid need pos_dim=2, got {pos_dim}")
        quarter = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
        k = int(torch.randint(1, 4, (1,), generator=gen))
        return torch.linalg.matrix_power(quarter, k)
    q, r = torch.linalg.qr(torch.randn(pos_dim, pos_dim, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def with_padding(
    layout: PositionLayout, x: Tensor, extra: int, gen: torch.Generator, at: float | Sequence[float] | None = None
) -> tuple[PositionLayout, Tensor]:
    """``extra`` padding tokens (valid False, has_pos True) appended to the tokens: positions
    ~ N(0, 50^2), or all at the point ``at`` (a grid encoding's padding sits on a cell, or
    ties with a real token), and contents ~ N(0, 10^2), i.e. far away and large. The
    layout's ``grid_shape`` is kept (padding comes after the grid)."""
    b, n, p = layout.coords.shape
    if at is None:
        pad_coords = 50.0 * torch.randn(b, extra, p, generator=gen, dtype=layout.coords.dtype)
    else:
        pad_coords = torch.as_tensor(at, dtype=layout.coords.dtype).expand(b, extra, p)
    garbage = 10.0 * torch.randn(b, extra, x.shape[-1], generator=gen, dtype=x.dtype)
    padded = PositionLayout(
        coords=torch.cat([layout.coords, pad_coords], dim=1),
        has_pos=torch.cat([layout.has_pos, torch.ones(b, extra, dtype=torch.bool)], dim=1),
        valid=torch.cat([torch.ones(b, n, dtype=torch.bool), torch.zeros(b, extra, dtype=torch.bool)], dim=1),
        grid_shape=layout.grid_shape,
    )
    return padded, torch.cat([x, garbage], dim=1)


# --------------------------------------------------------------------------- layer probes


def make_attention(
    name: str,
    pos_dim: int,
    options: dict | None = None,
    grid_shape: tuple[int, ...] | None = None,
    cross: bool = False,
    seed: int = 0,
) -> Attention:
    """A float64 attention layer (layer 0 of a depth-1 encoding) of the registered encoding
    ``name``, width ``LAYER_DIM``, weights seeded by ``seed`` (global generator)."""
    torch.manual_seed(seed)
    geometry = Geometry(pos_dim=pos_dim, grid_shape=grid_shape)
    encoding = build(name, geometry, LAYER_DIM, LAYER_HEADS, depth=1, options=options)
    return Attention(LAYER_DIM, LAYER_HEADS, encoding.make_layer(0), cross=cross).double()


def efficient_and_explicit(
    name: str, pos_dim: int, options: dict | None = None, cross: bool = False
) -> tuple[Attention, Attention]:
    """The ``form="efficient"`` and ``form="explicit"`` layers of one encoding with identical
    weights: the two must give the same logits and outputs."""
    efficient = make_attention(name, pos_dim, {**(options or {}), "form": "efficient"}, cross=cross)
    explicit = make_attention(name, pos_dim, {**(options or {}), "form": "explicit"}, cross=cross)
    explicit.load_state_dict(efficient.state_dict())
    return efficient, explicit


def plain_copy(attn: Attention) -> Attention:
    """The same attention weights without any position encoding."""
    plain = Attention(LAYER_DIM, LAYER_HEADS, None, cross=attn.cross).double()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("encoding.")})
    return plain


def random_layout(
    batch: int, n: int, pos_dim: int, prefix: int = 0, scale: float = 4.0, seed: int = 1
) -> tuple[PositionLayout, Tensor]:
    """``prefix`` position-free tokens then n irregular positions ~ N(0, scale^2), float64;
    returns (layout, x) with contents x of width ``LAYER_DIM``."""
    gen = torch.Generator().manual_seed(seed)
    coords = scale * torch.randn(batch, prefix + n, pos_dim, generator=gen, dtype=torch.float64)
    has_pos = torch.ones(batch, prefix + n, dtype=torch.bool)
    has_pos[:, :prefix] = False
    x = torch.randn(batch, prefix + n, LAYER_DIM, generator=gen, dtype=torch.float64)
    return PositionLayout(coords=coords, has_pos=has_pos), x


def padded_grid(grid: tuple[int, ...], dim: int, seed: int = 1) -> tuple[Tensor, PositionLayout]:
    """Two samples of a CLS token and the ``grid``'s cells, the second sample's last three
    tokens padding; returns (x, layout) with float32 contents x of width ``dim``."""
    layout = PositionLayout.grid(2, grid, 1)
    layout.valid = torch.ones(2, layout.coords.shape[1], dtype=torch.bool)
    layout.valid[1, -3:] = False
    x = torch.randn(2, layout.coords.shape[1], dim, generator=torch.Generator().manual_seed(seed))
    return x, layout


def assert_padding_inert(attn: Attention, layout: PositionLayout, x: Tensor, extra: int = 5) -> None:
    """Padding appended to the tokens changes neither the real logits nor the real outputs,
    and padding keys are masked out entirely (-inf logits)."""
    n = x.shape[1]
    padded, x_pad = with_padding(layout, x, extra, torch.Generator().manual_seed(2))
    torch.testing.assert_close(attn.logits(x_pad, padded)[:, :, :n, :n], attn.logits(x, layout))
    torch.testing.assert_close(attn(x_pad, padded)[:, :n], attn(x, layout))
    if not torch.isneginf(attn.logits(x_pad, padded)[:, :, :, n:]).all():
        raise AssertionError("padding keys are not masked out: some of their logits are not -inf")


def assert_cls_position_free(attn: Attention, layout: PositionLayout, x: Tensor, prefix: int) -> None:
    """The stored coordinates of the ``prefix`` position-free tokens are ignored, and logits
    between two position-free tokens are the plain q.k / sqrt(h) of the same weights."""
    moved = layout.coords.clone()
    moved[:, :prefix] = 123.0 * torch.randn_like(moved[:, :prefix])
    torch.testing.assert_close(attn.logits(x, replace(layout, coords=moved)), attn.logits(x, layout))
    plain = plain_copy(attn).logits(x, layout)
    torch.testing.assert_close(attn.logits(x, layout)[:, :, :prefix, :prefix], plain[:, :, :prefix, :prefix])


def assert_all_parameters_learn(attn: Attention, layout: PositionLayout, x: Tensor) -> None:
    """A backward pass gives every entry of every trainable encoding parameter a non-zero gradient."""
    params = {name: p for name, p in attn.encoding.named_parameters() if p.requires_grad}
    if not params:
        raise AssertionError("the encoding has no trainable parameters")
    attn.zero_grad()
    # A non-linear loss of the output: a plain sum could cancel by symmetry.
    attn(x, layout).square().sum().backward()
    for name, p in params.items():
        if p.grad is None:
            raise AssertionError(f"{name} got no gradient")
        flat = p.grad.flatten()
        if not (flat != 0).all():
            raise AssertionError(f"{name}: {int((flat == 0).sum())} of {flat.numel()} entries got zero gradient")
