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

#: compiled variants of flex_attention one process may hold: Dynamo compiles one per score_mod
#: (every encoding has its own), grad mode (training, evaluation) and shape. Its default of 8
#: was measured too few on an H200 (issue 16): a benchmark with three compilations per bias
#: encoding reached it at the third encoding, and Dynamo then ran flex_attention eagerly
#: (unfused, N x N scores) without an error.
FLEX_RECOMPILE_LIMIT = 128


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    raise_recompile_limit(FLEX_RECOMPILE_LIMIT)
    return torch.compile(flex_attention, dynamic=False)


def raise_recompile_limit(limit: int) -> None:
    """Let Dynamo keep at least ``limit`` compiled entries per code object (never lowers it;
    harness/compile.py raises it too, for per-block compilation)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, limit)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * limit)


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


def indexed_once(t: Tensor) -> list[Tensor]:
    """The columns t[..., c] of a tensor a score_mod reads, each a tensor of its own (a copy),
    for a score_mod that indexes each of them once.

    Inductor's Flex backward (what every CUDA training step compiles) refuses a tensor that
    requires gradients and is indexed more than once in a score_mod ("Using multiple indexing
    operations on the same tensor that requires gradients ... not currently supported",
    torch 2.11 on an H100): each index becomes its own scatter of the gradient, and it does
    not add two scatters into one buffer. PaPE's explicit form read s_k[n, h, j, c] for every
    c, and SaPE² each vector at i and at j, so both failed to train on CUDA. A score_mod that
    needs a tensor at i and at j takes two calls of this (two sets of copies). Checked on the
    CPU by tests/harness/test_flex_attention.py with Inductor's own validation of the joint
    graph.
    """
    return [t[..., c].clone(memory_format=torch.contiguous_format) for c in range(t.shape[-1])]


#: the narrowest head the compiled CUDA kernels take, for q/k and for v ("NYI: embedding
#: dimension of the query, key, and value must be at least 16", torch 2.11 on an H200).
CUDA_MIN_HEAD_DIM = 16


def kernel_min_head_dim(device: torch.device) -> int:
    return CUDA_MIN_HEAD_DIM if device.type == "cuda" else 1


def pad_heads(q: Tensor, k: Tensor, v: Tensor, minimum: int) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v with their last dimension zero-padded to at least ``minimum``: q . k is
    unchanged (the extra products are 0), and v's extra columns give output columns of 0 that
    the caller drops; the softmax, its log-sum-exp and every gradient are those of the inputs."""

    def pad(x: Tensor) -> Tensor:
        return torch.nn.functional.pad(x, (0, minimum - x.shape[-1])) if x.shape[-1] < minimum else x

    return pad(q), pad(k), pad(v)


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

    value_width = v.shape[-1]
    if q.device.type == "cuda":
        # Expanded inputs (a stride of 0, e.g. SaPE²'s step values shared by all heads) are
        # materialised for the compiled kernels. Suspected, not confirmed, cause of SaPE²'s
        # "SmallVector unable to grow" compile error on an H200 (its values were expanded).
        q, k, v = (t.contiguous() if 0 in t.stride() else t for t in (q, k, v))
    minimum = kernel_min_head_dim(q.device)
    if min(q.shape[-1], v.shape[-1]) < minimum:  # narrow heads (tiny models, tests)
        scale = q.shape[-1] ** -0.5 if scale is None else scale  # of the true width, not the padded
        q, k, v = pad_heads(q, k, v, minimum)
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
        return out[..., :value_width], aux.lse
    return result[..., :value_width]
