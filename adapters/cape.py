"""CAPE: continuous augmented positional embeddings (Likhomanenko et al., "CAPE: Encoding
Relative Positions with Continuous Augmented Positional Embeddings", arXiv 2106.03143).

Sinusoidal features of positions that are, at training time only, mean-normalised,
globally shifted, locally shifted and globally scaled (Section 4, Appendix A); at
evaluation only mean-normalised. Features are added to the input tokens.

Frequencies:
* P = 1 (text, speech): ω_k = freq_scale * base^(-k/K'), K' = D/2 (Eq. 1; speech uses
  freq_scale = 30 with positions in seconds);
* P = 2 (images, on [-1, 1] coordinates): π ρ_k (cos k, sin k), ρ_k = 10^(k/K') (Eq. 3-4);
* P >= 3: our generalisation: π ρ_k u_k with u_k unit directions spread over the sphere by a
  golden-angle spiral, so that, as in 2D, no direction is preferred and every component
  has its own direction.
* `directions: axes` (an ablation, not the paper's): u_k is the k mod P-th coordinate axis,
  so every component sees one coordinate, as in per-axis sincos. CAPE chose mixed
  ("hatching") directions on purpose, so that a query can attend to a small region without
  favouring tokens that share only x or only y (its Section 3, below Eq. 4). The price shows
  where a label depends on one axis alone: on the tiny scannet (classes by height), CAPE
  without its augmentations scores 52.8 mIoU with hatching and 60.1 with axes (README,
  Stable seeds).

CLS: pe-bench adds no feature to tokens without a position, and they do not enter the
mean normalisation. The paper's ViTs give the class token a learnable absolute embedding
(its Appendix B.1: "All models use learnable absolute positional embedding for the class
token"); added to a learnable class token, a learnable constant is the same parameters
twice, so leaving it out changes no function the model can learn.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor

from .base import EncodingOptions, PositionEncoding, PositionLayout, Principle, sinusoid_features
from .registry import register
from .transforms import cape_augment, grid_to_unit, mean_normalize


class CAPEOptions(EncodingOptions):
    max_global_shift: float = Field(0.5, ge=0.0)  # Δmax (CAPE Section 5.1: 0.5 for images)
    max_local_shift: float | None = Field(None, ge=0.0)  # εmax; None: 1/N per grid axis (paper), 0 off-grid
    max_scale: float = Field(1.4, ge=1.0)  # λmax
    coordinates: Literal["unit-grid", "raw"] = "unit-grid"  # images: grid -> [-1, 1]
    base: float = Field(10000.0, gt=0.0)  # 1-D frequency ladder
    freq_scale: float = Field(1.0, gt=0.0)  # 1-D: ω_k multiplier (30 for speech in seconds)
    # Multiplies mean-normalised positions that are not mapped to the unit grid, before
    # augmentation. CAPE maps images to [-1, 1] (Eq. 3-4), where its lowest 2-D frequency, pi,
    # spans the image once; off-grid positions in raw units (patches, 50 ms steps, metres) span
    # many such wavelengths, and the global scale then scrambles every long offset's phase.
    # Tasks set it to bring their extent to about [-1, 1]; 1.0 keeps the raw units. One number
    # keeps the geometry (metric scenes, where rotations matter); one per axis maps each axis
    # to [-1, 1] on its own, as CAPE does for an image's two axes (Figure 1): for axes of
    # different kinds, such as an event stream's patches and time.
    coordinate_scale: float | tuple[float, ...] = 1.0
    # "hatching": each frequency on its own direction, mixing the axes (the paper, Eq. 4);
    # "axes": each frequency on one coordinate axis in turn (an ablation; module docstring).
    # Positions with one axis (text, speech) use the 1-D ladder, where both are the same.
    directions: Literal["hatching", "axes"] = "hatching"

    @field_validator("coordinate_scale", mode="before")
    @classmethod
    def _positive_scales(cls, value: object) -> object:
        values = list(value) if isinstance(value, list | tuple) else [value]
        if not values or not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values):
            raise ValueError("must be a number > 0, or a list of numbers > 0, one per position axis")
        return tuple(float(v) for v in values) if isinstance(value, list | tuple) else float(value)


def axis_directions(count: int, pos_dim: int) -> Tensor:
    """Unit vectors along the coordinate axes in turn: frequency k sees coordinate k mod P."""
    return torch.eye(pos_dim)[torch.arange(count) % pos_dim]


def spiral_directions(count: int, pos_dim: int) -> Tensor:
    """Unit vectors for each frequency: (cos k, sin k) in 2D (CAPE Eq. 4), a spherical
    Fibonacci spiral in 3D, Gaussian directions from a fixed seed above."""
    k = torch.arange(count, dtype=torch.float64)
    if pos_dim == 2:
        return torch.stack([torch.cos(k), torch.sin(k)], dim=-1).float()
    if pos_dim == 3:
        z = 1 - 2 * (k + 0.5) / count
        radius = torch.sqrt(1 - z**2)
        theta = math.pi * (3 - math.sqrt(5)) * k
        return torch.stack([radius * torch.cos(theta), radius * torch.sin(theta), z], dim=-1).float()
    gen = torch.Generator().manual_seed(0)
    dirs = torch.randn(count, pos_dim, generator=gen, dtype=torch.float64)
    return (dirs / dirs.norm(dim=-1, keepdim=True)).float()


@register("cape")
class CAPE(PositionEncoding):
    principles = frozenset({Principle.FUSED_KERNEL})
    Options = CAPEOptions
    # On a grid it maps every resolution to [-1, 1] itself (Eq. 3-4), which is its
    # interpolation; positions scaled by train/test on top shrank that range twice. (Raw
    # coordinates could be scaled, but extrapolation runs images, which use the unit grid.)
    supports_position_interpolation = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        half = self.dim // 2
        p = self.geometry.pos_dim
        if p == 1:
            omega = self.options.freq_scale * torch.exp(-math.log(self.options.base) * torch.arange(half) / half)
            freqs = omega.unsqueeze(-1)
        else:
            rho = 10 ** (torch.arange(1, half + 1, dtype=torch.float32) / half)
            along = axis_directions if self.options.directions == "axes" else spiral_directions
            freqs = math.pi * rho.unsqueeze(-1) * along(half, p)
        self.register_buffer("frequencies", freqs.float(), persistent=False)
        scale = self.options.coordinate_scale
        if isinstance(scale, tuple) and len(scale) != p:
            raise ValueError(
                f"cape: coordinate_scale has {len(scale)} entries, the task's positions have {p} axes; "
                f"give one number, or one per axis (e.g. coordinate_scale=[{', '.join(['0.1'] * p)}])"
            )
        # A buffer, so that it lives on the model's device: no host-to-device copy per forward.
        self.register_buffer("coordinate_scale", torch.tensor(scale, dtype=torch.float32), persistent=False)
        self.generator: torch.Generator | None = None  # tests may pin the augmentation RNG

    def _local_shift(self, layout: PositionLayout) -> float | list[float]:
        if self.options.max_local_shift is not None:
            return self.options.max_local_shift
        if layout.grid_shape is None:
            return 0.0
        if self.options.coordinates == "raw":
            # 1/N is the paper's εmax on [-1, 1] coordinates, about half a grid step there; in
            # raw units it would be a tenth of a step of 1 at N = 10, silently another setting.
            raise ValueError(
                "cape: coordinates=raw on a grid needs an explicit max_local_shift in the coordinates' "
                "units: the paper's default 1/N is for [-1, 1] (about half a grid step), e.g. "
                "cape[max_local_shift=0.5] for half a step of 1"
            )
        return [1.0 / n for n in layout.grid_shape]

    def prepare(self, layout: PositionLayout) -> PositionLayout:
        # Position-free tokens' entries set to 0 first: they may be NaN, which the scale's
        # gradient and the sinusoids would carry however the embedding is masked.
        layout = layout.with_coords(layout.coords_or_zero())
        on_unit_grid = self.options.coordinates == "unit-grid" and layout.grid_shape is not None
        if on_unit_grid:
            layout = grid_to_unit(layout)
        layout = mean_normalize(layout)
        if not on_unit_grid and self.options.coordinate_scale != 1.0:
            layout = layout.with_coords(layout.coords * self.coordinate_scale.to(layout.coords.dtype))
        if self.training:
            layout = cape_augment(
                layout,
                self.options.max_global_shift,
                self._local_shift(layout),
                self.options.max_scale,
                self.generator,
            )
        return layout

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        emb = sinusoid_features(layout.coords_or_zero(torch.float32), self.frequencies)
        emb = torch.where(layout.has_pos.unsqueeze(-1), emb, 0.0)
        return torch.cat([x[..., : emb.shape[-1]] + emb.to(x.dtype), x[..., emb.shape[-1] :]], dim=-1)
