"""Position transforms, separate from the encodings so any encoding can use them.

* ``mean_normalize``:    subtract each sequence's mean position (CAPE step i).
* ``cape_augment``:      CAPE's global shift, local shift and global scale (Eq. 5-7 of
                         "CAPE: Encoding Relative Positions with Continuous Augmented
                         Positional Embeddings", arXiv 2106.03143).
* ``grid_to_unit``:      grid indices -> [-1, 1] per axis (CAPE's image coordinates).
* ``interpolate``:       multiply positions by train/test resolution (PaPE, arXiv 2602.01418, Appendix B).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .base import PositionLayout, masked_mean


def mean_normalize(layout: PositionLayout) -> PositionLayout:
    centre = masked_mean(layout.coords, layout.positioned)
    return layout.with_coords(layout.coords - centre)


def grid_to_unit(layout: PositionLayout) -> PositionLayout:
    """Map cell index c of an n-cell axis to -1 + 2c/(n-1), as CAPE's linspace(-1, 1, n)."""
    if layout.grid_shape is None:
        raise ValueError("grid_to_unit needs a grid layout (layout.grid_shape is None)")
    step = torch.tensor([2.0 / max(n - 1, 1) for n in layout.grid_shape], device=layout.coords.device)
    return layout.with_coords(layout.coords * step - 1.0)


def cape_augment(
    layout: PositionLayout,
    max_global_shift: float,
    max_local_shift: float | Sequence[float],
    max_scale: float,
    generator: torch.Generator | None = None,
) -> PositionLayout:
    """x' = λ (x + Δ + ε_i): Δ ~ U(±Δmax) per sequence and axis, ε_i ~ U(±εmax) per token and
    axis, log λ ~ U(±log λmax) per sequence (CAPE, arXiv 2106.03143, Section 4 and Appendix A)."""
    if max_scale < 1:
        raise ValueError(f"CAPE max_scale must be >= 1, got {max_scale}")
    coords = layout.coords
    b, n, p = coords.shape

    def uniform(*shape: int) -> Tensor:
        if generator is None:
            # no generator= keyword at all: Dynamo cannot trace torch.rand(..., generator=None)
            # once the batch size is dynamic (a compiled model's second batch shape)
            u = torch.rand(*shape, device=coords.device)
        else:
            u = torch.rand(*shape, generator=generator, device="cpu")
        return (2 * u - 1).to(coords.device, coords.dtype)

    local = torch.as_tensor(max_local_shift, dtype=coords.dtype, device=coords.device)
    shifted = coords + max_global_shift * uniform(b, 1, p) + local * uniform(b, n, p)
    scale = torch.exp(math.log(max_scale) * uniform(b, 1, 1))
    return layout.with_coords(shifted * scale)


def interpolate(layout: PositionLayout, factor: float) -> PositionLayout:
    """Position interpolation: scale positions by train/test resolution (PaPE, arXiv 2602.01418, Appendix B)."""
    return layout.with_coords(layout.coords * factor)
