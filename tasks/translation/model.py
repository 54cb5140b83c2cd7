"""Encoder-decoder transformer for translation, with any encoding in all three attentions.

Positions are token indices in *units of the target*: target token j sits at j, source
token i at alpha * i where alpha = (# target tokens) / (# source tokens) of the training
corpus (CAPE Section 5.3), so that aligned words of the two sentences get similar
positions and cross-attention can compare them. Each sequence starts at 0.

Per encoding family (the task options ``cross_attention_positions`` and
``shared_frame_methods`` choose; see the task config):

* input encodings (sincos, abspos, cape, nopos) act in the encoder and decoder inputs only;
  they have no per-layer module, so cross-attention sees positions only through the tokens.
* per-layer encodings (rope, relpos, alibi, pape, ...) act in encoder self-attention and
  causal decoder self-attention, and, when ``cross_attention_positions`` is on, also in
  cross-attention, where the offset between target query j and source key i is
  alpha * i - j: a prior towards the monotone diagonal. Off, cross-attention is content-only
  (T5 and Shaw et al. put relative positions in self-attention only).
* shared-frame encodings (CAPE): the encoding's own ``prepare`` (mean-normalisation, then
  augmentation) is replaced by the joint augmentation of CAPE Appendix D: no
  mean-normalisation (it would leak the target length into a causal decoder and
  misalign source and target), one global shift and scale per sentence pair applied to
  source *and* target, independent local shifts per token. Evaluation uses no augmentation.
  A begin-of-sentence token at the start of the source then marks the first position.

Encoder and decoder each own an instance of the encoding (separate per-layer parameters);
the decoder's has 2 x depth layers when cross-attention uses positions (self-attention
layers 0..L-1, cross-attention layers L..2L-1). Embeddings are shared by source, target
and output projection (one joint sentencepiece vocabulary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from pe_bench.adapters import EncodingFactory, Geometry, PositionLayout
from pe_bench.adapters.base import padding_mask
from pe_bench.harness.blocks import DecoderBlock, EncoderBlock
from pe_bench.harness.config import ModelConfig

from .tokenizer import PAD

#: CAPE Appendix D: local shift "set to maximum to preserve positions order".
MT_LOCAL_SHIFT = 0.5
#: CAPE Appendix D's global shift and scale for translation (Δmax 5, no scaling): what a
#: shared-frame method gets when neither the profile nor the spec sets them. Not CAPEOptions'
#: defaults, which are Section 5.1's image values (Δmax 0.5, λmax 1.4).
MT_GLOBAL_SHIFT = 5.0
MT_SCALE = 1.0


@dataclass(frozen=True)
class PositionFrame:
    """How source and target positions relate (see module docstring)."""

    source_scale: float = 1.0  # alpha
    cross_attention_positions: bool = False
    shared_frame: bool = False  # joint CAPE-style augmentation, encoding.prepare bypassed
    max_global_shift: float = 0.0
    max_local_shift: float = MT_LOCAL_SHIFT
    max_scale: float = 1.0


def repeat_layout(layout: PositionLayout, times: int) -> PositionLayout:
    """Each batch row repeated ``times`` times in place (beam search: row b -> b*K..b*K+K-1)."""
    valid = None if layout.valid is None else layout.valid.repeat_interleave(times, 0)
    return replace(
        layout,
        coords=layout.coords.repeat_interleave(times, 0),
        has_pos=layout.has_pos.repeat_interleave(times, 0),
        valid=valid,
    )


class Seq2SeqTransformer(nn.Module):
    def __init__(
        self,
        make_encoding: EncodingFactory,
        geometry: Geometry,
        model: ModelConfig,
        vocab_size: int,
        frame: PositionFrame,
    ) -> None:
        super().__init__()
        dim, depth, heads = model.dim, model.depth, model.num_heads
        self.frame = frame
        # A 1-D grid as long as the longest sequence the model should cover (abspos' table,
        # relpos' default window); layouts always state this grid, so abspos indexes its
        # table directly instead of resizing it to each batch length.
        self.geometry = geometry
        self.max_positions = geometry.grid_shape[0]
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=PAD)
        nn.init.normal_(self.embedding.weight, std=dim**-0.5)
        with torch.no_grad():
            self.embedding.weight[PAD].zero_()
        self.embed_scale = math.sqrt(dim)  # unit-variance tokens, as fairseq/Vaswani et al.
        self.dropout = nn.Dropout(model.dropout)
        cross = frame.cross_attention_positions
        self.encoder_encoding = make_encoding(self.geometry, dim, heads, depth)
        self.decoder_encoding = make_encoding(self.geometry, dim, heads, 2 * depth if cross else depth)
        rates = torch.linspace(0, model.drop_path, depth).tolist() if depth > 1 else [model.drop_path]
        self.encoder_blocks = nn.ModuleList(
            EncoderBlock(dim, heads, self.encoder_encoding, i, model.mlp_ratio, rates[i], model.dropout)
            for i in range(depth)
        )
        self.decoder_blocks = nn.ModuleList(
            DecoderBlock(
                dim,
                heads,
                self.decoder_encoding,
                i,
                depth + i if cross else None,
                model.mlp_ratio,
                rates[i],
                model.dropout,
            )
            for i in range(depth)
        )
        self.encoder_norm = nn.LayerNorm(dim)
        self.decoder_norm = nn.LayerNorm(dim)

    # -- positions -------------------------------------------------------------------------
    def frame_noise(self, batch: int, device: torch.device) -> tuple[Tensor, Tensor] | None:
        """Shared global shift and scale per sentence pair (training, shared frame only)."""
        if not (self.training and self.frame.shared_frame):
            return None
        shift = (2 * torch.rand(batch, 1, 1, device=device) - 1) * self.frame.max_global_shift
        log_scale = (2 * torch.rand(batch, 1, 1, device=device) - 1) * math.log(self.frame.max_scale)
        return shift, log_scale.exp()

    def _layout(self, tokens: Tensor, step: float, noise: tuple[Tensor, Tensor] | None) -> PositionLayout:
        b, n = tokens.shape
        coords = (torch.arange(n, device=tokens.device, dtype=torch.float32) * step).expand(b, n).unsqueeze(-1)
        if noise is not None:
            shift, scale = noise
            local = (2 * torch.rand(b, n, 1, device=tokens.device) - 1) * self.frame.max_local_shift
            coords = (coords + shift + local) * scale
        valid = tokens != PAD
        return PositionLayout(
            coords=coords,
            has_pos=torch.ones(b, n, dtype=torch.bool, device=tokens.device),
            valid=padding_mask(valid),
            grid_shape=self.geometry.grid_shape,
        )

    def _embed(self, tokens: Tensor, layout: PositionLayout, encoding: nn.Module) -> Tensor:
        x = encoding.embed(self.embedding(tokens) * self.embed_scale, layout)
        x = self.dropout(x)
        if layout.valid is not None:
            # Padding carries zeros so nothing in it can leak (as TransformerEncoder does).
            x = torch.where(layout.valid.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device))
        return x

    # -- model -----------------------------------------------------------------------------
    def encode(
        self, src: Tensor, noise: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, PositionLayout, PositionLayout]:
        """Source ids (B, S) -> memory (B, S, D), its self-attention layout, its cross-attention layout."""
        frame = self.frame
        if frame.shared_frame:
            layout = self._layout(src, frame.source_scale, noise).sharing_features()
            memory_layout = layout
        else:
            # Integer positions in the encoder's own frame (abspos indexes rows, relpos
            # offsets stay exact); the alpha-scaled frame is only for cross-attention.
            layout = self.encoder_encoding.prepare(self._layout(src, 1.0, None)).sharing_features()
            memory_layout = self._layout(src, frame.source_scale, None)
        x = self._embed(src, layout, self.encoder_encoding)
        for block in self.encoder_blocks:
            x = block(x, layout)
        return self.encoder_norm(x), layout, memory_layout

    def decode(
        self, tgt: Tensor, memory: Tensor, memory_layout: PositionLayout, noise: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        """Target ids (B, T) (bos first) -> next-token logits (B, T, V); causal."""
        layout = self._layout(tgt, 1.0, noise)
        if not self.frame.shared_frame:
            layout = self.decoder_encoding.prepare(layout)
        layout = layout.sharing_features()  # one memo of position-only features per forward
        x = self._embed(tgt, layout, self.decoder_encoding)
        for block in self.decoder_blocks:
            x = block(x, layout, memory, memory_layout)
        return self.decoder_norm(x) @ self.embedding.weight.T

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        noise = self.frame_noise(src.shape[0], src.device)
        memory, _, memory_layout = self.encode(src, noise)
        return self.decode(tgt, memory, memory_layout, noise)
