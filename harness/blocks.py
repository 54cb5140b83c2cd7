"""Transformer building blocks shared by every backbone (pre-norm, drop path)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pe_bench.adapters.base import LayerEncoding, PositionEncoding, PositionLayout
from pe_bench.adapters.init_stream import encoding_draws

from .attention import Attention


def layer_encoding(encoding: PositionEncoding, layer_index: int) -> LayerEncoding:
    """``encoding.make_layer(layer_index)``, its random draws from the encodings' own stream
    under ``model.paired_init`` (adapters/init_stream.py)."""
    with encoding_draws():
        return encoding.make_layer(layer_index)


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch per sample during training."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape[0], *([1] * (x.ndim - 1)), device=x.device) >= self.p
        return x * keep.to(x.dtype) / (1.0 - self.p)


class Mlp(nn.Sequential):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))


class EncoderBlock(nn.Module):
    """Pre-norm self-attention block: x + attn(norm(x)), x + mlp(norm(x))."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: PositionEncoding,
        layer_index: int,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, layer_encoding(encoding, layer_index), dropout=dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, layout: PositionLayout) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), layout))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class TransformerEncoder(nn.Module):
    """A stack of encoder blocks with one position encoding.

    The encoding's ``prepare`` and ``embed`` run once at the input; its per-layer modules
    live inside each block's attention.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        encoding: PositionEncoding,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.encoding = encoding
        rates = torch.linspace(0, drop_path, depth).tolist() if depth > 1 else [drop_path]
        self.blocks = nn.ModuleList(
            EncoderBlock(dim, num_heads, encoding, i, mlp_ratio, rates[i], dropout) for i in range(depth)
        )
        self.norm = nn.LayerNorm(dim)

    def _input(self, x: Tensor, layout: PositionLayout) -> tuple[Tensor, PositionLayout]:
        """The input path every layer sees: prepared positions, embedded tokens, zeroed padding."""
        # One memo of position-only features per forward, shared by every block's attention.
        layout = self.encoding.prepare(layout).sharing_features()
        x = self.encoding.embed(x, layout)
        if layout.valid is not None:
            # Padding tokens carry zeros so nothing in them can leak anywhere.
            # (torch.where, not a product, so that even NaN in padding is cleared.)
            x = torch.where(layout.valid.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device))
        return x, layout

    def forward(self, x: Tensor, layout: PositionLayout) -> Tensor:
        x, layout = self._input(x, layout)
        for block in self.blocks:
            x = block(x, layout)
        return self.norm(x)

    def layer_logits(
        self, x: Tensor, layout: PositionLayout, layer: int = 0, perturbation: Tensor | None = None
    ) -> Tensor:
        """Pre-softmax logits (B, H, N, N) of block ``layer``'s attention, masked entries -inf,
        on exactly the path :meth:`forward` takes to that block.

        ``perturbation`` (B, N, dim) is added to the normalised tokens entering that attention,
        for sensitivity analyses (the conformance suite's context-awareness). This builds the
        N x N matrix explicitly: for analysis and tests, never for training.
        """
        if not -len(self.blocks) <= layer < len(self.blocks):
            raise IndexError(f"layer={layer} is out of range for an encoder of depth {len(self.blocks)}")
        x, layout = self._input(x, layout)
        for block in self.blocks[:layer]:
            x = block(x, layout)
        block = self.blocks[layer]
        tokens = block.norm1(x)
        if perturbation is not None:
            tokens = tokens + perturbation
        return block.attn.logits(tokens, layout)


class DecoderBlock(nn.Module):
    """Pre-norm decoder block: causal self-attention, cross-attention to the encoder output,
    MLP, each as x + branch(norm(x)).

    Self-attention uses ``encoding.make_layer(layer_index)``. Cross-attention (queries at
    target positions, keys at source positions) gets ``encoding.make_layer(cross_layer_index)``,
    or no positional action at all when ``cross_layer_index`` is None: whether positions act
    across the two sequences is the task's decision, not the block's.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: PositionEncoding,
        layer_index: int,
        cross_layer_index: int | None = None,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.0,
        dropout: float = 0.0,
        context_dim: int | None = None,
    ) -> None:
        super().__init__()
        cross_encoding = None if cross_layer_index is None else layer_encoding(encoding, cross_layer_index)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, layer_encoding(encoding, layer_index), dropout=dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_attn = Attention(
            dim, num_heads, cross_encoding, dropout=dropout, cross=True, context_dim=context_dim
        )
        self.norm3 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, layout: PositionLayout, memory: Tensor, memory_layout: PositionLayout) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), layout, causal=True))
        x = x + self.drop_path(self.cross_attn(self.norm2(x), layout, context=memory, key=memory_layout))
        return x + self.drop_path(self.mlp(self.norm3(x)))
