"""The event ViT: Spiking Patches tokens -> ViT encoder -> CLS head (PaPE on DvsGesture).

Token embedding as Øhrstrøm et al. (2025): log(1 + counts) of the (2, buckets, patch,
patch) volume, then a learned linear map to the model width (their Conv2d with kernel =
stride = patch is exactly this). Positions are (patch x, patch y, spike time x
``time_scale``) - PaPE scales microseconds by 1/50,000 on DvsGesture. Samples have
different token counts: a batch is padded to its longest sequence and ``valid`` masks the
padding (the CLS token, without position, is always valid).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pe_bench.adapters import EncodingFactory, Geometry, PositionLayout
from pe_bench.harness.config import ModelConfig
from pe_bench.tasks._shared.spiking_patches import EventBatch, EventTokens, pad_tokens
from pe_bench.tasks._shared.vit import TokenClassifier, prepend_token


def collate_tokens(items: list[tuple[EventTokens, int]]) -> tuple[EventBatch, Tensor]:
    """Pad variable-length token sequences to the longest of the batch (at least one slot)."""
    labels = torch.tensor([label for _, label in items])
    return pad_tokens([tokens for tokens, _ in items]), labels


#: Irregular positions: tokens appear where and when patches spike, no grid.
EVENT_GEOMETRY = Geometry(pos_dim=3, grid_shape=None, units="patch, patch, time x scale", num_prefix_tokens=1)


class EventViT(TokenClassifier):
    """ViT over Spiking Patches tokens (positions x, y, t of each token; a position-free CLS).

    Args:
        make_encoding: builds the position encoding.
        geometry: :data:`EVENT_GEOMETRY` (the task's ``geometry()``).
        model: width, depth, heads, ...
        feature_shape: the shape of one token's features (polarity, time buckets, patch, patch).
        time_scale: factor from event time to position units.
        num_classes: classes of the head.
    """

    def __init__(
        self,
        make_encoding: EncodingFactory,
        geometry: Geometry,
        model: ModelConfig,
        feature_shape: tuple[int, ...],
        time_scale: float,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.time_scale = time_scale
        self.embed = nn.Linear(math.prod(feature_shape), model.dim)
        self.build_trunk(make_encoding, geometry, model, num_classes)

    def forward(self, batch: EventBatch) -> Tensor:
        tokens = self.embed(torch.log1p(batch.features.flatten(2)))
        x = prepend_token(self.cls_token, tokens)
        scale = torch.tensor([1.0, 1.0, self.time_scale], device=x.device)
        coords = torch.cat([torch.zeros_like(batch.coords[:, :1]), batch.coords * scale], dim=1)
        cls = torch.ones_like(batch.valid[:, :1])
        has_pos = torch.cat([~cls, torch.ones_like(batch.valid)], dim=1)
        valid = torch.cat([cls, batch.valid], dim=1)
        layout = PositionLayout(coords=coords, has_pos=has_pos, valid=valid)
        return self.head(self.encoder(x, layout)[:, 0])
