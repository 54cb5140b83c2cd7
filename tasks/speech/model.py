"""CTC acoustic model (CAPE Section 5.2, after Likhomanenko et al. 2021's rasr recipe):
1D convolution (kernel 7, stride 3) + GLU, dropout, a transformer encoder on the shared
attention core with any position encoding, a linear layer to the CTC alphabet.

Positions are the times of the front-end frames, 1-D. What one unit means is chosen per
encoding: ``second`` (CAPE's setting: freq_scale 30 on seconds) or ``frame`` (one unit per
front-end frame, 30 ms: the unit in which relpos' integer offsets, ALiBi's slopes and the
RoPE/sincos frequency ladders are defined). Encodings that need a grid (abspos) get frame
indices modulo a fixed window of ``window_frames`` with the window as their grid, which is
CAPE's *abspos* E(t) = E(t mod N) for utterances longer than the window; without modulo
they get the utterance's own grid, and abspos resizes its table to it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor, nn

from pe_bench.adapters import EncodingFactory, Geometry, PositionLayout
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.config import ModelConfig

KERNEL = 7
STRIDE = 3


@dataclass(frozen=True)
class FrontEnd:
    n_mels: int = 80
    hop_seconds: float = 0.01
    dropout: float = 0.3  # after the convolution (CAPE App. C.2)

    @property
    def frame_seconds(self) -> float:
        return STRIDE * self.hop_seconds


def output_lengths(lengths: Tensor) -> Tensor:
    """Frames after the unpadded stride-3 convolution (inputs shorter than the kernel give 0)."""
    return torch.div(lengths - KERNEL, STRIDE, rounding_mode="floor").clamp_min(-1) + 1


def speech_geometry(window_frames: int, unit: str = "frame") -> Geometry:
    return Geometry(pos_dim=1, grid_shape=(window_frames,), units=unit, num_prefix_tokens=0)


class CTCSpeechModel(nn.Module):
    def __init__(
        self,
        make_encoding: EncodingFactory,
        geometry: Geometry,
        model: ModelConfig,
        vocab_size: int,
        front: FrontEnd,
        unit: Literal["frame", "second"],
        window_frames: int,
        modulo: bool = True,
    ) -> None:
        super().__init__()
        self.front = front
        self.unit = unit
        self.window_frames = window_frames
        self.modulo = modulo
        self.uses_grid = make_encoding.cls.requires_grid
        self.conv = nn.Conv1d(front.n_mels, 2 * model.dim, KERNEL, STRIDE)
        self.glu = nn.GLU(dim=1)
        self.conv_dropout = nn.Dropout(front.dropout)
        self.geometry = replace(geometry, units=unit)  # the task's geometry, in this encoding's unit
        self.encoding = make_encoding(self.geometry, model.dim, model.num_heads, model.depth)
        self.encoder = TransformerEncoder(
            model.dim, model.depth, model.num_heads, self.encoding, model.mlp_ratio, model.drop_path, model.dropout
        )
        self.head = nn.Linear(model.dim, vocab_size)
        if model.head_init == "zero":  # uniform initial posteriors over the alphabet and blank
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def layout(self, lengths: Tensor, frames: int) -> PositionLayout:
        index = torch.arange(frames, device=lengths.device, dtype=torch.float32)
        valid = index.unsqueeze(0) < lengths.unsqueeze(1)
        grid: tuple[int, ...] | None = None
        if self.uses_grid:
            if self.modulo:
                index, grid = torch.remainder(index, self.window_frames), (self.window_frames,)
            else:
                grid = (frames,)
        elif self.unit == "second":
            index = index * self.front.frame_seconds
        coords = index.view(1, frames, 1).expand(lengths.shape[0], -1, -1)
        return PositionLayout(coords=coords, has_pos=torch.ones_like(valid), valid=valid, grid_shape=grid)

    def forward(self, feats: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """feats (B, T, n_mels) zero-padded, lengths (B,) -> logits (B, T', V), lengths (B,)."""
        x = self.conv_dropout(self.glu(self.conv(feats.transpose(1, 2)))).transpose(1, 2)
        out_lengths = output_lengths(lengths)
        x = self.encoder(x, self.layout(out_lengths, x.shape[1]))
        return self.head(x), out_lengths
