"""Detectors: a plain ViT (images) or an event ViT (Spiking Patches tokens), then ViTDet's
simple feature pyramid and the YOLOv10-style dual head (PaPE §5.1 and Appendix E).

Only the backbone's attention sees the position encoding; the pyramid and head are
convolutional on the backbone map. For images that map is the patch grid itself. Event
tokens are asynchronous, so PaPE turns the backbone's outputs into an image-like map by
filling each patch cell with the output of the most recent token at that cell
(:func:`latest_token_map`); cells where no token fired get a learned "empty" vector.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pe_bench.adapters import EncodingFactory, Geometry, PositionLayout
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.config import ModelConfig
from pe_bench.tasks._shared.spiking_patches import EventBatch
from pe_bench.tasks._shared.vit import image_geometry, prepend_token

from .head import DetectorOutput, DualHead
from .pyramid import LEVEL_SCALES, SimpleFeaturePyramid


class DetectionModelConfig(ModelConfig):
    """The backbone's fields, plus the neck and head."""

    neck_dim: int = 256  # channels of the pyramid levels and the heads (ViTDet: 256)
    reg_max: int = 16  # bins of each box side's distance distribution (YOLOv8: 16)
    # per image at evaluation. At most COCO's 100: pycocotools caps 100 per image and class, not
    # per image, so more would let an image score more than COCO's AP counts (an audit fed it
    # 150 exact boxes of two classes and got AP 1.0)
    max_detections: int = Field(100, ge=1, le=100)
    # Spatial kernels of the neck's second projection (ViTDet: 3) and of the class branch's
    # depthwise convolutions (YOLOv10: 3). 1 makes the path from the backbone to the class
    # scores pointwise, so that every relation between positions it uses comes from the
    # backbone's position encoding: a 3x3 stack relates neighbouring cells by itself and reads
    # the image border from its zero padding. The box branch keeps its 3x3 convolutions.
    neck_kernel: Literal[1, 3] = 3
    class_kernel: Literal[1, 3] = 3
    # Learned tokens without a position prepended to the image backbone's patches and dropped
    # before the pyramid (Darcet et al., "Vision Transformers Need Registers", ICLR 2024).
    # The detector has no CLS (nor has PaPE's official one); a position-free key changes what
    # some encodings can express (the coco section of the README), this measures it.
    register_tokens: int = Field(0, ge=0)


class Detector(nn.Module):
    """Pyramid and dual head on a (B, dim, h, w) backbone map of stride ``stride`` pixels."""

    def __init__(self, dim: int, stride: int, model: DetectionModelConfig, num_classes: int) -> None:
        super().__init__()
        if stride % 2:
            raise ValueError(f"the backbone stride (patch size) must be even for the stride/2 level, got {stride}")
        self.pyramid = SimpleFeaturePyramid(dim, model.neck_dim, model.neck_kernel)
        self.head = DualHead(
            model.neck_dim, tuple(stride * s for s in LEVEL_SCALES), num_classes, model.reg_max, model.class_kernel
        )

    def forward(self, feature_map: Tensor) -> DetectorOutput:
        return self.head(self.pyramid(feature_map))


def image_detection_geometry(image_size: tuple[int, int], patch: int, registers: int = 0) -> Geometry:
    """The patch grid (row, col) in patch units after ``registers`` position-free tokens; no
    CLS token (the head reads the grid)."""
    return replace(image_geometry(image_size, patch), num_prefix_tokens=registers)


class ImageDetector(nn.Module):
    """ViT (no CLS token) -> patch-grid map -> :class:`Detector`."""

    def __init__(
        self,
        make_encoding: EncodingFactory,
        geometry: Geometry,
        model: DetectionModelConfig,
        in_channels: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.geometry = geometry
        self.patch_embed = nn.Conv2d(in_channels, model.dim, kernel_size=model.patch_size, stride=model.patch_size)
        self.encoding = make_encoding(geometry, model.dim, model.num_heads, model.depth)
        self.encoder = TransformerEncoder(
            model.dim, model.depth, model.num_heads, self.encoding, model.mlp_ratio, model.drop_path, model.dropout
        )
        self.detector = Detector(model.dim, model.patch_size, model, num_classes)
        registers = geometry.num_prefix_tokens
        # None without registers, so that checkpoints of register-free models keep their keys.
        self.registers = nn.Parameter(torch.randn(1, registers, model.dim) * 0.02) if registers else None
        self.position_scale = 1.0  # position interpolation (PaPE Appendix B)

    def forward(self, images: Tensor) -> DetectorOutput:
        tokens = self.patch_embed(images)
        batch, dim, rows, cols = tokens.shape
        x = tokens.flatten(2).transpose(1, 2)
        if self.registers is not None:
            x = prepend_token(self.registers, x)
        prefix = self.geometry.num_prefix_tokens
        layout = PositionLayout.grid(batch, (rows, cols), prefix, device=tokens.device, scale=self.position_scale)
        x = self.encoder(x, layout)[:, prefix:]
        return self.detector(x.transpose(1, 2).reshape(batch, dim, rows, cols))


#: Irregular positions (x, y in patches, time x scale), no prefix token.
EVENT_DETECTION_GEOMETRY = Geometry(pos_dim=3, grid_shape=None, units="patch, patch, time x scale")


def latest_token_map(tokens: Tensor, coords: Tensor, valid: Tensor, rows: int, cols: int, empty: Tensor) -> Tensor:
    """(B, N, D) token outputs at (B, N, 3) (patch x, patch y, time) -> (B, D, rows, cols): each
    cell holds the output of its most recent valid token (ties: the later in the sequence), or
    ``empty`` (D,) where no token fired."""
    batch, _, dim = tokens.shape
    order = torch.sort(coords[..., 2], dim=1, stable=True).indices  # token index of each time rank
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(order.shape[1], device=order.device).expand_as(order)
    )
    cell = (coords[..., 1].long() * cols + coords[..., 0].long()).clamp(0, rows * cols - 1)
    rank = torch.where(valid, rank, torch.full_like(rank, -1))
    latest = torch.full((batch, rows * cols), -1, dtype=rank.dtype, device=rank.device)
    latest = latest.scatter_reduce(1, cell, rank, reduce="amax")
    index = order.gather(1, latest.clamp_min(0))
    cells = tokens.gather(1, index[..., None].expand(-1, -1, dim))
    cells = torch.where((latest >= 0)[..., None], cells, empty.to(cells.dtype))
    return cells.transpose(1, 2).reshape(batch, dim, rows, cols)


class EventDetector(nn.Module):
    """Event ViT over Spiking Patches tokens -> most-recent-token map -> :class:`Detector`.

    Token embedding as the event ViT of Øhrstrøm et al. (2025, arXiv:2510.26614): log(1 + counts)
    of the (2, buckets, patch, patch) volume and a learned linear map.
    """

    def __init__(
        self,
        make_encoding: EncodingFactory,
        geometry: Geometry,
        model: DetectionModelConfig,
        feature_shape: tuple[int, ...],
        grid: tuple[int, int],
        time_scale: float,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.geometry, self.grid, self.time_scale = geometry, grid, time_scale
        self.embed = nn.Linear(math.prod(feature_shape), model.dim)
        self.encoding = make_encoding(geometry, model.dim, model.num_heads, model.depth)
        self.encoder = TransformerEncoder(
            model.dim, model.depth, model.num_heads, self.encoding, model.mlp_ratio, model.drop_path, model.dropout
        )
        self.empty = nn.Parameter(torch.zeros(model.dim))
        self.detector = Detector(model.dim, model.patch_size, model, num_classes)

    def forward(self, batch: EventBatch) -> DetectorOutput:
        x = self.embed(torch.log1p(batch.features.flatten(2)))
        scale = torch.tensor([1.0, 1.0, self.time_scale], device=x.device)
        # A stream without tokens would leave its attention rows fully masked (NaN): its first
        # (padding) slot attends as a blank token; the map still ignores it (``batch.valid``).
        attending = batch.valid.clone()
        attending[:, 0] |= ~batch.valid.any(1)
        layout = PositionLayout(coords=batch.coords * scale, has_pos=torch.ones_like(attending), valid=attending)
        x = self.encoder(x, layout)
        return self.detector(latest_token_map(x, batch.coords, batch.valid, *self.grid, self.empty))
