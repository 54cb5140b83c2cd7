"""A float32-accurate matrix product on 16-bit matrix units: PaPE's positional bias.

PaPE's and PaPE-RI's ``low_precision: bias`` form the product of their float32 positional
features, <f_q_i, f_k_j>, as an N x N bias: the parabola's terms cancel inside it, so it needs
float32's 24 bits. As a float32 matmul it runs at float32's rate, not on the tensor cores
(profiled on an H100, 11-28: the bias form's float32 GEMMs took 52 ms of its 359 ms in three
ViT-B steps at batch 128), and TF32 would round the features to 10 bits.

Here every float32 number x is carried as three bf16 pieces, x = hi + mid + lo (8 bits each,
24 in all, exactly float32's; hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid), each
difference exact in float32). A product a . b keeps the six piece products of order 2^-16 and
above (hi hi, hi mid, mid hi, hi lo, lo hi, mid mid); those left out are below 2^-24 of |a||b|,
float32's own rounding. Products of bf16 numbers are exact and the matrix units add them in
float32, so one bf16 matmul over the pieces concatenated along the inner dimension (6 x its
width) gives the float32 product. The backward's products dS . f have a 16-bit factor already
(SDPA returns dS, the bias's gradient, in q's dtype), so they need only the three pieces of f,
side by side: one matmul per side, which reads dS once.

Speed (an estimate; not measured on a GPU): at ViT-B's 197 tokens the forward's 6x wider bf16
operands make its small matmuls memory-bound, so it should take about the float32 GEMM's time;
the backward reads dS once per side in bf16 instead of running two float32 GEMMs. What it
certainly changes: TF32 settings no longer matter (bf16 pieces are exact in TF32).

On CUDA the matmuls are ``torch.bmm(..., out_dtype=torch.float32)``: bf16 inputs, float32
sums and output. Elsewhere (CPU, and CUDA builds without that overload) the bf16 pieces are
multiplied as float32 numbers, the same exact products with float32 sums.

Keys shared by the batch (a grid every sample shares) multiply head-major when that writes
less (below, ``_head_major_pays``): one GEMM per head over the whole batch's rows, instead of
a copy of the keys' pieces per sample. And keys prepared once (``keys_for_product``) serve
several products: the chunks of queries of one attention call at long sequences.

The pieces are bf16 whatever the heads' 16-bit dtype, so they are cut and arranged with
autocast off (``_without_autocast``): under a float16 autocast (``precision: 16-mixed``) the
concatenations of bf16 pieces are "promote" operators, which refuse a bf16 tensor where the
autocast dtype is float16 ("Unexpected floating ScalarType in at::autocast::prioritize").
A float16 bias's gradient becomes bf16 for the backward's products: a relative error of each
pair's own term (2^-9), as a bf16 gradient already has.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._rounding import rounded_pieces

PIECE_DTYPE = torch.bfloat16

#: the bf16 -> float32 batched matmul on the matrix units, where this torch has it
_WIDE_BMM = "dtype" in torch.ops.aten.bmm.overloads()


def pieces(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x (float32) as hi + mid + lo, three bf16 tensors whose float32 sum is x to 24 bits
    (each difference exact: x and hi share their leading bits). ``rounded_pieces``: compiled,
    by an operator the compiler cannot fuse the roundings out of."""
    hi, mid, lo = rounded_pieces(x, PIECE_DTYPE, 3)
    return hi, mid, lo


class Float32Keys(NamedTuple):
    """The right-hand side b of ``float32_product`` in the form its matmuls read, prepared
    once (``keys_for_product``) for every product with it: PaPE's key features, which the
    chunks of queries of one attention call all multiply (``shared_by_query_chunks``)."""

    value: Tensor  #: b itself, float32 (B or 1, H, m, w): what its gradient is the gradient of
    product: Tensor  #: the six-piece arrangement of the forward, one (6w, m) matrix per (sample,) head
    backward: Tensor | None  #: hi, mid and lo side by side, (m, 3w) per (sample,) head; None: no gradient


def keys_for_product(b: Tensor) -> Float32Keys:
    """b (float32, (B or 1, H, m, w)) split into pieces and arranged for the matmuls, in
    their operand dtype (``_operand``), one matrix per sample and head (per head when the
    batch shares b). The backward's arrangement only when autograd is on."""
    with _without_autocast(b):
        hi, mid, lo = pieces(b)
        product = _operand(torch.cat([hi, mid, hi, lo, hi, mid], dim=-1)).transpose(-1, -2).flatten(0, 1)
        backward = _operand(torch.cat([hi, mid, lo], dim=-1)).flatten(0, 1) if torch.is_grad_enabled() else None
    return Float32Keys(b, product, backward)


def _without_autocast(x: Tensor) -> torch.autocast:
    """Autocast off on ``x``'s device: the pieces stay bf16 and their concatenations take them
    as they are (module doc; the concatenations give the same bits with autocast on in bf16)."""
    return torch.autocast(x.device.type, enabled=False)


def _operand(x: Tensor) -> Tensor:
    """A bf16 matmul operand as ``_wide_bmm`` reads it: as it is on CUDA with the
    float32-output bmm, else as float32 numbers (exactly the same values)."""
    return x if x.is_cuda and _WIDE_BMM else x.float()


def _wide_bmm(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for bf16 (G, n, k) and (G, k, m) (or their float32 ``_operand`` forms), in
    float32: exact products, float32 sums."""
    a, b = _operand(a), _operand(b)
    with torch.autocast(a.device.type, enabled=False):
        if a.dtype == PIECE_DTYPE:
            return torch.bmm(a, b, out_dtype=torch.float32)
        return torch.bmm(a, b)


# The matmuls run one GEMM per key matrix. Keys shared by the batch (PaPE's, on a grid every
# sample shares) are one matrix per head, and two layouts of the rows are possible:
# * head-major: all samples' rows of a head, (H, B, n, .) as (H, B * n, .), in one GEMM with
#   that head's matrix. The keys' gradient, a sum over the batch, is then part of the GEMM's
#   contraction, but the (B, H, n, m) gradient must be copied into that order: B H m (2 n)
#   bytes;
# * per sample (B x H GEMMs): the keys' pieces are copied B times (6 w and 3 w bf16 columns),
#   and the keys' gradient comes as B float32 products (3 w) and piece sums (2 w) summed
#   afterwards: B H m (18 w + 20 w) bytes.
# Head-major therefore pays when 19 w > n (``_head_major_pays``), and always without autograd,
# which has no gradient to copy: PaPE at m = 50 (w = 101) at ViT-B's 197 tokens; not PaPE-RI
# (w = 4). (Keys without a gradient of their own save only the copies, 9 w > n; the rule keeps
# 19 w: at w = 101 both hold, at w = 4 neither.) Measured bytes written per bf16 training step
# at batch 8 (ViT-B, CPU): PaPE's bias form 9,181 -> 8,085 MiB; PaPE-RI's would rise by 38 MiB,
# so it keeps the per-sample layout.


def _head_major_pays(a: Tensor, b: Tensor, training: bool) -> bool:
    """Whether ``float32_product`` lays its rows out head-major (the comment above)."""
    shared = b.shape[0] == 1 and a.shape[0] > 1
    return shared and (not training or 19 * a.shape[-1] > a.shape[-2])


def _per_pair(keys: Tensor, batch: int, heads: int) -> Tensor:
    """The keys' (G, ., .) matrices, one per sample and head: copied over the batch when the
    batch shares them (G = H)."""
    if keys.shape[0] == batch * heads:
        return keys
    return keys.unsqueeze(0).expand(batch, *keys.shape).reshape(batch * heads, *keys.shape[1:])


def _head_major(x: Tensor, shared: bool) -> Tensor:
    """(B, H, ...) viewed as the matmuls' order of rows: (H, B, ...) when the keys are
    shared by the batch, else as it is (see above)."""
    return x.transpose(0, 1) if shared else x


def _contiguous_as(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x in ``dtype``, laid out contiguously, in one pass (``to`` alone keeps x's strides)."""
    return x.contiguous() if x.dtype == dtype else x.to(dtype, memory_format=torch.contiguous_format)


class _Float32Product(torch.autograd.Function):
    """a @ b^T for float32 a (B, H, n, w) and b (B or 1, H, m, w), rounded to ``out_dtype``;
    b arrives with its pieces (``Float32Keys``)."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, keys: Float32Keys, out_dtype: torch.dtype) -> Tensor:
        with _without_autocast(a):  # bf16 pieces under a float16 autocast too (module doc)
            return _Float32Product._forward(ctx, a, b, keys, out_dtype)

    @staticmethod
    def _forward(ctx, a: Tensor, b: Tensor, keys: Float32Keys, out_dtype: torch.dtype) -> Tensor:
        """``forward``'s work, with autocast off."""
        batch, heads = a.shape[:2]
        training = keys.backward is not None
        shared = _head_major_pays(a, b, training)
        # pieces of a in the matmuls' order of rows: the concatenations below write them so
        a_hi, a_mid, a_lo = a_pieces = pieces(_head_major(a, shared))
        if training:
            # the backward's operands: each side's three pieces side by side, so that one
            # matmul reads the N x N gradient once per side; a's gradient needs b's pieces and
            # b's needs a's, so a side without a gradient leaves the other's out
            ctx.shared, ctx.key_batch = shared, b.shape[0]
            need_a, need_b = ctx.needs_input_grad[:2]
            key_pieces = None
            if need_a:
                key_pieces = keys.backward if shared else _per_pair(keys.backward, batch, heads)
            query_pieces = _operand(_rows(torch.cat(a_pieces, dim=-1), shared)) if need_b else None
            ctx.save_for_backward(query_pieces, key_pieces)
        left = _rows(torch.cat([a_hi, a_hi, a_mid, a_hi, a_lo, a_mid], dim=-1), shared)
        right = keys.product if shared else _per_pair(keys.product, batch, heads)
        return _contiguous_as(_unrows(_wide_bmm(left, right), batch, heads, shared), out_dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        if not hasattr(ctx, "shared"):
            raise RuntimeError(
                "float32_product: its keys were prepared without autograd (keys_for_product"
                " under no_grad); prepare them where the gradient is wanted"
            )
        a_pieces, b_pieces = ctx.saved_tensors
        batch, heads, _, m = grad.shape
        # rounding the gradient to bf16 is a relative error of each pair's own term (none
        # when it comes from SDPA in bf16); the pieces of a and b keep their 24 bits.
        # Head-major, the gradient is laid out so first: one copy of it, in the pass that
        # rounds it if it is not bf16 already.
        rows = _rows(_contiguous_as(_head_major(grad, ctx.shared), PIECE_DTYPE), ctx.shared)
        # each side's product reads the N x N gradient once: skipped for a side without a
        # gradient (PaPE-RI's keys with its frozen w_p depend on positions alone)
        d_a = d_b = None
        if ctx.needs_input_grad[0]:
            d_a = _unrows(_sum_of_pieces(_wide_bmm(rows, b_pieces)), batch, heads, ctx.shared)
        if ctx.needs_input_grad[1]:
            # head-major, the contraction runs over the whole batch's rows: their gradient's sum
            d_b = _sum_of_pieces(_wide_bmm(rows.transpose(-1, -2), a_pieces))
            d_b = d_b.view(-1, heads, m, d_b.shape[-1])
            if d_b.shape[0] != ctx.key_batch:  # per sample, keys shared by the batch: summed over it
                d_b = d_b.sum(0, keepdim=True)
        return d_a, d_b, None, None


def _rows(x: Tensor, shared: bool) -> Tensor:
    """(B, H, n, k), or its ``_head_major`` view (H, B, n, k) when ``shared``, laid out
    contiguously in that order -> (G, rows, k): each key matrix's block of rows (a view)."""
    return x.flatten(1, 2) if shared else x.flatten(0, 1)


def _unrows(x: Tensor, batch: int, heads: int, shared: bool) -> Tensor:
    """``_rows``' inverse: (G, rows, k) -> (B, H, n, k), a view (strided when ``shared``)."""
    if shared:
        return x.view(heads, batch, -1, x.shape[-1]).transpose(0, 1)
    return x.view(batch, heads, -1, x.shape[-1])


def _sum_of_pieces(products: Tensor) -> Tensor:
    """(..., 3w) products with the hi, mid and lo pieces side by side -> their (..., w) sum."""
    hi, mid, lo = products.chunk(3, dim=-1)
    return hi + mid + lo


def float32_product(a: Tensor, b: Tensor | Float32Keys, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """a @ b^T for float32 a (B, H, n, w) and b (B or 1, H, m, w), to float32 accuracy on the
    16-bit matrix units (module doc), with its gradients, rounded once to ``out_dtype``. A
    16-bit ``out_dtype`` (the bias as SDPA takes it) keeps the N x N product and its gradient
    out of float32: its gradient then arrives in 16 bits, instead of cast up and down again.
    ``b`` may come prepared (``keys_for_product``) when several products share it."""
    keys = b if isinstance(b, Float32Keys) else keys_for_product(b)
    return _Float32Product.apply(a, keys.value, keys, out_dtype)
