"""ViT (Dosovitskiy et al.): patch embedding, CLS token, pre-norm encoder, linear head.

Positions are patch-grid coordinates (row, col) in patch units, starting at 0; the CLS
token has no position. ``position_scale`` multiplies positions (position interpolation,
PaPE Appendix B) without touching the model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pe_bench.adapters import EncodingFactory, Geometry, PositionLayout
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.config import ModelConfig


def classification_head(dim: int, num_classes: int, head_init: str) -> nn.Linear:
    """Linear head; "zero" (PaPE Appendix E) starts from uniform class probabilities."""
    head = nn.Linear(dim, num_classes)
    if head_init == "zero":
        nn.init.zeros_(head.weight)
        nn.init.constant_(head.bias, -math.log(num_classes))
    return head


def prepend_token(token: Tensor, tokens: Tensor) -> Tensor:
    """(1, 1, D) learned token (CLS) in front of every sequence of (B, N, D) tokens."""
    return torch.cat([token.expand(tokens.shape[0], -1, -1).to(tokens.dtype), tokens], dim=1)


class TokenClassifier(nn.Module):
    """What the ViT family shares after its token embedding: a learned CLS token without a
    position, the position encoding built for the task's geometry, the pre-norm encoder and
    the classification head. Subclasses build their embedding, then call ``build_trunk``."""

    def build_trunk(
        self, make_encoding: EncodingFactory, geometry: Geometry, model: ModelConfig, num_classes: int
    ) -> None:
        self.geometry = geometry
        self.cls_token = nn.Parameter(torch.zeros(1, 1, model.dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.encoding = make_encoding(geometry, model.dim, model.num_heads, model.depth)
        self.encoder = TransformerEncoder(
            model.dim, model.depth, model.num_heads, self.encoding, model.mlp_ratio, model.drop_path, model.dropout
        )
        self.head = classification_head(model.dim, num_classes, model.head_init)


def image_geometry(image_size: tuple[int, int], patch: int) -> Geometry:
    """Patch-grid positions (row, col) in patch units after one position-free CLS token."""
    if image_size[0] % patch or image_size[1] % patch:
        raise ValueError(f"image size {image_size} is not a multiple of the patch size {patch}")
    grid = (image_size[0] // patch, image_size[1] // patch)
    return Geometry(pos_dim=2, grid_shape=grid, units="patch", num_prefix_tokens=1)


class ViT(TokenClassifier):
    """ViT-style image classifier.

    Args:
        make_encoding: builds the position encoding (:class:`~pe_bench.adapters.EncodingFactory`).
        geometry: the training grid, from :func:`image_geometry` (the task's ``geometry()``).
        model: width, depth, heads, patch size, MLP ratio, drop path, head initialisation.
        in_channels: image channels.
        num_classes: classes of the head.
    """

    def __init__(
        self, make_encoding: EncodingFactory, geometry: Geometry, model: ModelConfig, in_channels: int, num_classes: int
    ) -> None:
        super().__init__()
        patch = model.patch_size
        self.patch_size = patch
        self.patch_embed = nn.Conv2d(in_channels, model.dim, kernel_size=patch, stride=patch)
        self.build_trunk(make_encoding, geometry, model, num_classes)
        self.position_scale = 1.0

    def forward(self, images: Tensor) -> Tensor:
        tokens = self.patch_embed(images)
        grid = tuple(tokens.shape[2:])
        tokens = tokens.flatten(2).transpose(1, 2)
        x = prepend_token(self.cls_token, tokens)
        layout = PositionLayout.grid(x.shape[0], grid, 1, device=x.device, scale=self.position_scale)
        return self.head(self.encoder(x, layout)[:, 0])
