"""ViViT (Arnab et al., 2021) with tubelet embedding, as PaPE trains it on UCF101.

A Conv3d cuts the clip into tubelets of ``tubelet`` frames x ``patch`` x ``patch`` pixels;
every tubelet is one token at position (t, y, x) in tubelet/patch units from 0; a CLS
token without position goes first. Clips shorter than the model's time extent are
zero-padded in time and their missing tubelets masked out (``VideoBatch.steps``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from pe_bench.adapters import EncodingFactory, Geometry, PositionLayout
from pe_bench.adapters.base import padding_mask
from pe_bench.harness.config import ModelConfig
from pe_bench.tasks._shared.vit import TokenClassifier, prepend_token


@dataclass
class VideoBatch:
    video: Tensor  # (B, C, T, H, W)
    steps: Tensor | None = None  # (B,) valid tubelet time steps per clip; None = all

    def __len__(self) -> int:
        return self.video.shape[0]


def video_geometry(frames: int, image_size: tuple[int, int], tubelet: int, patch: int) -> Geometry:
    """Tubelet-grid positions (t, y, x) after one position-free CLS token."""
    if frames % tubelet or image_size[0] % patch or image_size[1] % patch:
        raise ValueError(f"clip {frames}x{image_size} is not a multiple of the tubelet {tubelet}x{patch}x{patch}")
    grid = (frames // tubelet, image_size[0] // patch, image_size[1] // patch)
    return Geometry(pos_dim=3, grid_shape=grid, units="tubelet", num_prefix_tokens=1)


class ViViT(TokenClassifier):
    """ViViT-style video classifier (tubelet embedding, joint space-time attention).

    Args:
        make_encoding: builds the position encoding.
        geometry: the training tubelet grid, from :func:`video_geometry` (the task's ``geometry()``).
        model: width, depth, heads, patch size, ...
        tubelet: frames per tubelet.
        in_channels: frame channels.
        num_classes: classes of the head.
    """

    def __init__(
        self,
        make_encoding: EncodingFactory,
        geometry: Geometry,
        model: ModelConfig,
        tubelet: int,
        in_channels: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        size = (tubelet, model.patch_size, model.patch_size)
        self.tubelet_embed = nn.Conv3d(in_channels, model.dim, kernel_size=size, stride=size)
        self.build_trunk(make_encoding, geometry, model, num_classes)

    def forward(self, batch: VideoBatch | Tensor) -> Tensor:
        if isinstance(batch, Tensor):
            batch = VideoBatch(batch)
        tokens = self.tubelet_embed(batch.video)
        grid = tuple(tokens.shape[2:])
        x = prepend_token(self.cls_token, tokens.flatten(2).transpose(1, 2))
        layout = PositionLayout.grid(x.shape[0], grid, 1, device=x.device)
        if batch.steps is not None:
            # Row-major (t, y, x): the first steps * H' * W' tokens are the real tubelets.
            step_of_token = torch.arange(grid[0], device=x.device).repeat_interleave(grid[1] * grid[2])
            valid = step_of_token[None] < batch.steps.to(x.device)[:, None]
            valid = torch.cat([torch.ones_like(valid[:, :1]), valid], dim=1)
            layout = replace(layout, valid=padding_mask(valid))
        return self.head(self.encoder(x, layout)[:, 0])
