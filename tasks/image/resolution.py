"""Training and testing a ViT across image resolutions (CAPE §5.1.2 and §5.1.3).

- :class:`RandomBatchResolution` is UniViT's training: every batch is resized to a side drawn
  uniformly from a list (CAPE: 128² … 320² in steps of 32), so one model sees many patch grids.
- :class:`ResizeTTA` is resizing as test-time augmentation: the logits at (r−δ)², r² and (r+δ)²
  are averaged (CAPE: δ = 32, r = 224 or 384).

Both act on a whole batch tensor, after the data pipeline, so they work for every image
source alike (generated, ImageFolder, CIFAR). The test-time resize therefore starts from the
r² evaluation image rather than from the original file; with antialiased bicubic resizing
the difference is a second interpolation of an image that was already resampled once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.harness.config import ConfigError


def resize_batch(images: Tensor, side: int) -> Tensor:
    """(B, C, H, W) -> (B, C, side, side), antialiased bicubic; a no-op at the same size."""
    if images.shape[-2:] == (side, side):
        return images
    return F.interpolate(images, size=(side, side), mode="bicubic", align_corners=False, antialias=True)


def check_sides(sides: list[int], patch: int, key: str) -> None:
    """Every side must hold a whole number of patches, or the patch embedding drops pixels."""
    bad = [s for s in sides if s <= 0 or s % patch]
    if bad:
        raise ConfigError(
            f"{key}: sides {bad} are not positive multiples of the patch size {patch}; "
            f"use e.g. {[max(patch, round(s / patch) * patch) for s in bad]}"
        )


class RandomBatchResolution:
    """UniViT: resize each training batch to a random side from ``sides`` (square, as CAPE)."""

    def __init__(self, sides: list[int]) -> None:
        self.sides = list(sides)

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        # torch's global generator is seeded per cell (seed_everything): runs are repeatable.
        side = self.sides[int(torch.randint(len(self.sides), ()))]
        return resize_batch(images, side), labels


class ResizeTTA:
    """Mean logits over the test images resized to r−δ, r and r+δ (r: the images' own side)."""

    def __init__(self, delta: int) -> None:
        self.delta = delta

    def sides(self, side: int) -> list[int]:
        return [side - self.delta, side, side + self.delta]

    def __call__(self, model: nn.Module, images: Tensor) -> Tensor:
        side = images.shape[-1]
        logits = [model(resize_batch(images, s)).float() for s in self.sides(side)]
        return torch.stack(logits).mean(0)


class ComposeBatch:
    """Apply batch transforms ``(images, labels) -> (images, labels)`` in order."""

    def __init__(self, *transforms) -> None:
        self.transforms = [t for t in transforms if t is not None]

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        for transform in self.transforms:
            images, labels = transform(images, labels)
        return images, labels
