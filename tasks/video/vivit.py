"""ViViT (Arnab et al., 2021) with tubelet embedding, as PaPE trains it on UCF101.

A Conv3d cuts the clip into tubelets of ``tubelet`` frames x ``patch`` x ``patch`` pixels;
every tubelet is one token at position (t, y, x) in tubelet/patch units from 0; a CLS
token without position goes first. Clips shorter than the model's time extent are
zero-padded in time and their missing tubelets masked out (``VideoBatch.steps``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from pe_bench.adapters import Geometry, PositionLayout
from pe_bench.harness.config import ModelConfig
from pe_bench.tasks._shared.vit import TokenClassifier, prepend_token


@dataclass
class VideoBatch:
    video: Tensor  # (B, C, T, H, W)
    steps: Tensor | None = None  # (B,) valid tubelet time steps per clip; None = all

    def __len__(self) -> int:
        return self.video.shape[0]


class ViViT(TokenClassifier):
    def __init__(
        self,
        method: str,
        method_options: dict[str, Any],
        model: ModelConfig,
        frames: int,
        image_size: tuple[int, int],
        tubelet: int,
        in_channels: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        patch = model.patch_size
        if frames % tubelet or image_size[0] % patch or image_size[1] % patch:
            raise ValueError(f"clip {frames}x{image_size} is not a multiple of the tubelet {tubelet}x{patch}x{patch}")
        grid = (frames // tubelet, image_size[0] // patch, image_size[1] // patch)
        self.geometry = Geometry(pos_dim=3, grid_shape=grid, units="tubelet", num_prefix_tokens=1)
        size = (tubelet, patch, patch)
        self.tubelet_embed = nn.Conv3d(in_channels, model.dim, kernel_size=size, stride=size)
        self.build_trunk(method, method_options, model, num_classes)

    def forward(self, batch: VideoBatch | Tensor) -> Tensor:
        if isinstance(batch, Tensor):
            batch = VideoBatch(batch)
        tokens = self.tubelet_embed(batch.video)
        grid = tuple(tokens.shape[2:])
        x = prepend_token(self.cls_token, tokens.flatten(2).transpose(1, 2))
        layout = PositionLayout.grid(x.shape[0], grid, 1, device=x.device)
        if batch.steps is not None and bool((batch.steps < grid[0]).any()):
            # Row-major (t, y, x): the first steps * H' * W' tokens are the real tubelets.
            step_of_token = torch.arange(grid[0], device=x.device).repeat_interleave(grid[1] * grid[2])
            valid = step_of_token[None] < batch.steps.to(x.device)[:, None]
            valid = torch.cat([torch.ones_like(valid[:, :1]), valid], dim=1)
            layout = replace(layout, valid=valid)
        return self.head(self.encoder(x, layout)[:, 0])
