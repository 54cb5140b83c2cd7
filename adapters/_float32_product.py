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
"""

from __future__ import annotations

import torch
from torch import Tensor

PIECE_DTYPE = torch.bfloat16

#: the bf16 -> float32 batched matmul on the matrix units, where this torch has it
_WIDE_BMM = "dtype" in torch.ops.aten.bmm.overloads()


def pieces(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x (float32) as hi + mid + lo, three bf16 tensors whose float32 sum is x to 24 bits."""
    hi = x.to(PIECE_DTYPE)
    rest = x - hi  # exact: x and hi share their leading bits
    mid = rest.to(PIECE_DTYPE)
    return hi, mid, (rest - mid).to(PIECE_DTYPE)


def _wide_matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for bf16 (..., n, k) and (..., k, m), b's leading dimensions broadcast to a's,
    in float32: exact products, float32 sums."""
    with torch.autocast(a.device.type, enabled=False):
        if a.device.type == "cuda" and _WIDE_BMM:
            lead = a.shape[:-2]
            b = b.expand(*lead, *b.shape[-2:])
            out = torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), out_dtype=torch.float32)
            return out.view(*lead, *out.shape[-2:])
        return a.float() @ b.float()


class _Float32Product(torch.autograd.Function):
    """a @ b^T for float32 a (B, ..., n, w) and b (B or 1, ..., m, w), rounded to ``out_dtype``."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, out_dtype: torch.dtype) -> Tensor:
        a_hi, a_mid, a_lo = a_pieces = pieces(a)
        b_hi, b_mid, b_lo = b_pieces = pieces(b)
        # the backward's operands: each side's three pieces side by side, so that one matmul
        # reads the N x N gradient once per side
        ctx.save_for_backward(torch.cat(a_pieces, dim=-1), torch.cat(b_pieces, dim=-1))
        left = torch.cat([a_hi, a_hi, a_mid, a_hi, a_lo, a_mid], dim=-1)
        right = torch.cat([b_hi, b_mid, b_hi, b_lo, b_hi, b_mid], dim=-1)
        return _wide_matmul(left, right.transpose(-1, -2)).to(out_dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        a_pieces, b_pieces = ctx.saved_tensors
        # rounding the gradient to bf16 is a relative error of each pair's own term (none
        # when it comes from SDPA in bf16); the pieces of a and b keep their 24 bits
        grad = grad.to(PIECE_DTYPE)
        d_a = _sum_of_pieces(_wide_matmul(grad, b_pieces))
        d_b = _sum_of_pieces(_wide_matmul(grad.transpose(-1, -2), a_pieces))
        if b_pieces.shape[0] != d_b.shape[0]:  # b shared by the batch: its gradient summed over it
            d_b = d_b.sum(0, keepdim=True)
        return d_a, d_b, None


def _sum_of_pieces(products: Tensor) -> Tensor:
    """(..., 3w) products with the hi, mid and lo pieces side by side -> their (..., w) sum."""
    hi, mid, lo = products.chunk(3, dim=-1)
    return hi + mid + lo


def float32_product(a: Tensor, b: Tensor, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """a @ b^T for float32 a (B, H, n, w) and b (B or 1, H, m, w), to float32 accuracy on the
    16-bit matrix units (module doc), with its gradients, rounded once to ``out_dtype``. A
    16-bit ``out_dtype`` (the bias as SDPA takes it) keeps the N x N product and its gradient
    out of float32: its gradient then arrives in 16 bits, instead of cast up and down again."""
    return _Float32Product.apply(a, b, out_dtype)
