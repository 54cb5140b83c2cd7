"""Running FlexAttention (``torch.nn.attention.flex_attention``) for the attention core and
for encodings that use it as a building block (SaPE²'s gated counts).

FlexAttention is only fast compiled: uncompiled it materialises the N x N scores. On CUDA
it is therefore called through ``torch.compile`` (unless the caller is already being
compiled, where it is traced into the caller's graph); elsewhere (CPU tests) it runs
eagerly, which computes the same function forward only.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor

from .base import MaskMod, ScoreMod


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def _compiled_create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def make_block_mask(mask_mod: MaskMod, batch: int | None, n_q: int, n_k: int, device: torch.device):
    """FlexAttention's block mask of ``mask_mod`` (the same for every head); compiled on CUDA,
    where the mask is then evaluated block by block instead of as a dense N x N tensor."""
    from torch.nn.attention.flex_attention import create_block_mask

    if device.type == "cuda" and not torch.compiler.is_compiling():
        return _compiled_create_block_mask()(mask_mod, batch, None, n_q, n_k, device=device)
    return create_block_mask(mask_mod, batch, None, n_q, n_k, device=device)


def run_flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    score_mod: ScoreMod | None = None,
    block_mask=None,
    scale: float | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """``flex_attention(q, k, v, ...)``, compiled on CUDA; with ``return_lse`` also the
    natural-log log-sum-exp of every query row, (B, H, Nq)."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    kwargs = {"score_mod": score_mod, "block_mask": block_mask, "scale": scale}
    if return_lse:
        kwargs["return_aux"] = AuxRequest(lse=True)
    if torch.compiler.is_compiling():  # traced into the caller's graph
        result = flex_attention(q, k, v, **kwargs)
    elif q.device.type == "cuda":
        result = _compiled_flex_attention()(q, k, v, **kwargs)
    else:
        with warnings.catch_warnings():
            # Eager Flex warns that it is unfused: expected on CPU.
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            result = flex_attention(q, k, v, **kwargs)
    if return_lse:
        out, aux = result
        return out, aux.lse
    return result
