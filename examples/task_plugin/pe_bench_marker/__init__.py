"""A complete third-party task: is marker B left or right of marker A in a sequence?

Every token is noise except two learned-looking markers; the label is the direction from A
to B along the sequence, so an encoding without directional position information stays at
chance. It lives in its own package and reaches pe-bench through the ``pe_bench.tasks``
entry point in pyproject.toml; its profiles are in ``marker-direction.yaml`` beside it.
"""

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from pe_bench.adapters import Geometry, PositionLayout
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.config import Strict
from pe_bench.harness.data import SplitDataModule
from pe_bench.harness.module import ClassificationModule
from pe_bench.tasks import Task


class MarkerData(Strict):
    length: int
    num_classes: int = 2
    train_size: int
    val_size: int
    test_size: int


def marker_sequences(count: int, length: int, seed: int) -> TensorDataset:
    """(count, length, 2) tokens: channel 0 marks A, channel 1 marks B, plus noise."""
    rng = np.random.default_rng(seed)
    tokens = rng.normal(0.0, 0.3, size=(count, length, 2)).astype(np.float32)
    a = rng.integers(0, length, count)
    b = (a + rng.integers(1, length, count)) % length  # never on A
    tokens[np.arange(count), a, 0] += 3.0
    tokens[np.arange(count), b, 1] += 3.0
    return TensorDataset(torch.from_numpy(tokens), torch.from_numpy((b > a).astype(np.int64)))


class MarkerModel(nn.Module):
    def __init__(self, make_encoding, geometry: Geometry, dim: int, depth: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.embed = nn.Linear(2, dim)
        self.encoder = TransformerEncoder(dim, depth, heads, make_encoding(geometry, dim, heads, depth), mlp_ratio)
        self.head = nn.Linear(dim, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        layout = PositionLayout.grid(tokens.shape[0], (tokens.shape[1],), device=tokens.device)
        return self.head(self.encoder(self.embed(tokens), layout).mean(dim=1))


class MarkerDataModule(SplitDataModule):
    def __init__(self, data: MarkerData, batch_size: int, seed: int) -> None:
        super().__init__(batch_size, num_workers=0, seed=seed)
        sizes = {"train": data.train_size, "val": data.val_size, "test": data.test_size}
        # Fixed data seeds per split: every cell of the grid sees the same sequences.
        self.splits = {name: marker_sequences(n, data.length, 7 + i) for i, (name, n) in enumerate(sizes.items())}


class MarkerDirection(Task):
    name = "marker-direction"
    metric_label = "Acc. (%)"
    profiles = ("tiny",)
    DataConfig = MarkerData
    config_file = Path(__file__).with_name("marker-direction.yaml")
    tiny_standin = "two markers in a noise sequence; label: is B right of A"

    def geometry(self) -> Geometry:
        return Geometry(pos_dim=1, grid_shape=(self.data.length,), units="token")

    def build_model(self, make_encoding) -> nn.Module:
        m = self.config.model
        return MarkerModel(make_encoding, self.geometry(), m.dim, m.depth, m.num_heads, m.mlp_ratio)

    def datamodule(self, seed: int) -> MarkerDataModule:
        return MarkerDataModule(self.data, self.config.optim.batch_size, seed)

    def lightning_module(self, model: nn.Module) -> ClassificationModule:
        return ClassificationModule(model, self.data.num_classes, self.config.optim)
