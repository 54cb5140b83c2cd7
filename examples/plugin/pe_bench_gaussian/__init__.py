"""A complete third-party encoding: a learnable Gaussian distance bias.

Each head h adds -softplus(w_h) * |r_j - r_i|^2 to the logits of positioned token pairs:
translation and rotation invariant, decaying with distance. It lives in its own package
and reaches pe-bench through the ``pe_bench.encodings`` entry point in pyproject.toml.
"""

import torch
import torch.nn.functional as F
from torch import nn

from pe_bench.adapters import EncodingOptions, LayerEncoding, PositionEncoding, Principle


class GaussianOptions(EncodingOptions):
    init: float = -1.0  # softplus(-1) = 0.31: a mild initial preference for near tokens


class GaussianBiasLayer(LayerEncoding):
    def __init__(self, num_heads: int, init: float) -> None:
        super().__init__()
        self.raw_width = nn.Parameter(torch.full((num_heads,), init))

    def bias(self, q, k, inputs):
        delta = inputs.key.coords[:, None, :, :] - inputs.query.coords[:, :, None, :]  # (B, Nq, Nk, P)
        squared = delta.square().sum(-1)
        # Position-free tokens (CLS) get no bias at all.
        pair = inputs.query.has_pos[:, :, None] & inputs.key.has_pos[:, None, :]
        squared = torch.where(pair, squared, torch.zeros_like(squared))
        return -F.softplus(self.raw_width)[None, :, None, None] * squared[:, None]


class GaussianBias(PositionEncoding):
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.ROTATION_INVARIANCE, Principle.DISTANCE_DECAY})
    Options = GaussianOptions

    def make_layer(self, layer_index):
        return GaussianBiasLayer(self.num_heads, self.options.init)
