"""The one attention core every backbone uses.

Positions enter through the layer's :class:`~pe_bench.adapters.base.LayerEncoding`:
q/k transforms run before SDPA, a bias (if any) is added to the logits. The logit scale
is always 1/sqrt(head_dim) of the *unwidened* head, so an encoding that widens q/k
(PaPE's efficient form) reproduces its bias form exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.adapters.base import AttentionInputs, LayerEncoding, PositionLayout


def attention_mask(
    bias: Tensor | None, key: PositionLayout, causal: bool, n_q: int, dtype: torch.dtype
) -> tuple[Tensor | None, bool]:
    """Combine bias, key padding and causality into SDPA's (attn_mask, is_causal).

    Without a bias the mask stays a broadcastable (B, 1, 1, Nk) boolean, so no N x N
    tensor is built for bias-free encodings.
    """
    key_valid = None if key.valid is None else key.valid[:, None, None, :]
    if bias is None:
        if not causal:
            return key_valid, False
        if key_valid is None:
            return None, True
        n_k = key_valid.shape[-1]
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=key_valid.device).tril(n_k - n_q)
        return key_valid & allowed, False
    bias = bias.to(dtype)
    if causal:
        n_k = bias.shape[-1]
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=bias.device).triu(n_k - n_q + 1)
        bias = bias.masked_fill(future, float("-inf"))
    if key_valid is not None:
        bias = bias.masked_fill(~key_valid, float("-inf"))
    return bias, False


class Attention(nn.Module):
    """Multi-head attention on ``scaled_dot_product_attention`` with a pluggable encoding.

    Self-attention when called with one layout, cross-attention when ``context`` (keys and
    values) and its ``key`` layout are given.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: LayerEncoding | None = None,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        cross: bool = False,
        context_dim: int | None = None,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.cross = cross
        if cross:
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(context_dim or dim, 2 * dim, bias=qkv_bias)
        else:
            self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.encoding = encoding
        self.dropout = dropout

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def _project(
        self, x: Tensor, query: PositionLayout, context: Tensor | None, key: PositionLayout | None, causal: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, PositionLayout]:
        """q, k (position-transformed), v, bias and the key layout."""
        if self.cross:
            if context is None or key is None:
                raise ValueError("cross-attention needs context tokens and their key layout")
            q = self._heads(self.q(x))
            k, v = (self._heads(t) for t in self.kv(context).chunk(2, dim=-1))
        else:
            context, key = x, query
            q, k, v = (self._heads(t) for t in self.qkv(x).chunk(3, dim=-1))
        bias = None
        if self.encoding is not None:
            inputs = AttentionInputs(x_q=x, x_k=context, query=query, key=key, causal=causal)
            q, k = self.encoding.transform_qk(q, k, inputs)
            bias = self.encoding.bias(q, k, inputs)
        return q, k, v, bias, key

    def forward(
        self,
        x: Tensor,
        query: PositionLayout,
        context: Tensor | None = None,
        key: PositionLayout | None = None,
        causal: bool = False,
    ) -> Tensor:
        q, k, v, bias, key = self._project(x, query, context, key, causal)
        mask, is_causal = attention_mask(bias, key, causal, q.shape[-2], q.dtype)
        if v.shape[-1] != q.shape[-1]:
            # Widened q/k (PaPE): the fused CPU and flash kernels need equal q/k/v widths and
            # otherwise fall back to the math kernel, which materialises N x N. Zero columns
            # in v keep the fused path; they are sliced off the output again.
            v = F.pad(v, (0, q.shape[-1] - v.shape[-1]))
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
            scale=1.0 / math.sqrt(self.head_dim),
        )[..., : self.head_dim]
        b, _, n, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))

    def logits(
        self,
        x: Tensor,
        query: PositionLayout,
        context: Tensor | None = None,
        key: PositionLayout | None = None,
        causal: bool = False,
    ) -> Tensor:
        """Pre-softmax logits (B, H, Nq, Nk), masked entries -inf: for analysis and tests.

        This builds the N x N matrix explicitly; training never calls it.
        """
        q, k, _, bias, key = self._project(x, query, context, key, causal)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        mask, is_causal = attention_mask(bias, key, causal, q.shape[-2], scores.dtype)
        if is_causal:
            n_q, n_k = scores.shape[-2:]
            mask = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).tril(n_k - n_q)
        if mask is None:
            return scores
        if mask.dtype == torch.bool:
            return scores.masked_fill(~mask, float("-inf"))
        return scores + mask
