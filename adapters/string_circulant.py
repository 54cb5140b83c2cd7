"""Circulant-STRING (Schenck et al., "Learning the RoPEs: Better 2D and 3D Position Encodings
with STRING", arXiv 2502.02562, Section 3.2, Example 2 and Theorem 3.5).

Generators L_k = C_k - C_k^T with C_k circulant, one per position axis k, per layer and head;
z -> exp(Σ_k r_k L_k) z. As in the paper's experiments (Appendix E) the head is split into
blocks of ``block_size`` channels, each with its own circulant generators (block-diagonal L_k).

FFT form: an antisymmetric circulant with first column u (u[m] = c[m] - c[-m]) is
diagonalised by the DFT with purely imaginary eigenvalues i φ, φ = Im(DFT u), so

    exp(Σ_k r_k L_k) z = IDFT( exp(i Σ_k r_k φ_k) ⊙ DFT z ),

computed per block with rfft/irfft in O(b log b). The DC and (even b) Nyquist components
have φ = 0 and never rotate; the other b/2 - 1 (odd b: (b-1)/2) Fourier planes rotate.

Parameters: u's free entries u[1..(b-1)//2] per block, axis and head (u[0] and u[b/2] are
0 and u[-m] = -u[m] for any C - C^T, so these determine L_k exactly and each one gets a
gradient; the paper's c_0 cancels in C - C^T and would never learn).

Initialisation (the paper gives none): u is chosen so that the rotating Fourier planes carry
axial RoPE's frequency ladder: plane j turns with axis j // levels at base^(-(j % levels) /
levels), levels = planes // P (leftover planes start at 0 and may learn). By Theorem 3.4 this
is exactly axial RoPE in the blockwise Fourier basis, the same start as Cayley-STRING.

CLS: as in _string.py, the identity at the centroid of the valid keys.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._string import STRINGEncoding, STRINGLayer, STRINGOptions
from .base import LayerEncoding
from .registry import register


class CirculantSTRINGOptions(STRINGOptions):
    block_size: int = 16  # Appendix E: 16 was best on ImageNet; capped at head_dim


def phases(free: Tensor, block: int) -> Tensor:
    """Free entries u[1..(b-1)//2] (..., n_free) -> Fourier rotation frequencies φ (..., b//2 + 1)."""
    n_free = free.shape[-1]
    u = free.new_zeros(*free.shape[:-1], block)
    u[..., 1 : n_free + 1] = free
    u[..., block - n_free :] = -free.flip(-1)  # u[-m] = -u[m]: antisymmetric circulant
    # Real odd u has a purely imaginary spectrum; keeping the imaginary part only makes the
    # rotation unit-modulus (orthogonal) exactly, not just up to FFT rounding.
    return torch.fft.rfft(u, dim=-1).imag


def free_entries_for(phi: Tensor, block: int) -> Tensor:
    """Inverse of ``phases`` for rotating planes φ[1..(b-1)//2] (..., n_free) -> u's free entries."""
    n_free = phi.shape[-1]
    spectrum = torch.zeros(*phi.shape[:-1], block // 2 + 1, dtype=torch.complex64)
    spectrum[..., 1 : n_free + 1] = 1j * phi
    return torch.fft.irfft(spectrum, n=block, dim=-1)[..., 1 : n_free + 1]


def initial_phases(num_heads: int, pos_dim: int, blocks: int, n_free: int, base: float) -> Tensor:
    """(H, P, blocks, n_free) axial-RoPE phases of the rotating planes (see module doc)."""
    planes = blocks * n_free
    levels = planes // pos_dim
    phi = torch.zeros(pos_dim, planes)
    ladder = base ** (-torch.arange(levels, dtype=torch.float32) / max(levels, 1))
    for axis in range(pos_dim):
        phi[axis, axis * levels : (axis + 1) * levels] = ladder
    return phi.view(pos_dim, blocks, n_free).expand(num_heads, -1, -1, -1).clone()


class CirculantSTRINGLayer(STRINGLayer):
    def __init__(self, num_heads: int, head_dim: int, pos_dim: int, block: int, base: float) -> None:
        super().__init__()
        self.block = block
        self.blocks = head_dim // block
        n_free = (block - 1) // 2
        phi = initial_phases(num_heads, pos_dim, self.blocks, n_free, base)
        self.u_free = nn.Parameter(free_entries_for(phi, block))  # (H, P, blocks, n_free)

    def generators(self) -> tuple[None, Tensor]:
        phi = phases(self.u_free, self.block)  # (H, P, blocks, b//2 + 1)
        return None, phi.flatten(-2)

    def encode(self, z: Tensor, angles: Tensor, basis: Tensor | None) -> Tensor:
        # angles: (B, H, N, blocks * (b//2 + 1)), the phase of every Fourier component.
        # The FFT runs in at least float32 (half-precision FFTs are restricted and lossy).
        dtype = torch.promote_types(z.dtype, torch.float32)
        blocks = z.unflatten(-1, (self.blocks, self.block)).to(dtype)
        spectrum = torch.fft.rfft(blocks, dim=-1)
        angles = angles.to(dtype)
        turn = torch.polar(torch.ones_like(angles), angles).unflatten(-1, (self.blocks, -1))
        out = torch.fft.irfft(spectrum * turn, n=self.block, dim=-1)
        return out.flatten(-2).to(z.dtype)


@register("string-circulant")
class CirculantSTRING(STRINGEncoding):
    Options = CirculantSTRINGOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        block = min(self.options.block_size, self.head_dim)
        if block < 3 or self.head_dim % block:
            raise ValueError(f"{self.name}: block_size {block} must be >= 3 and divide head_dim {self.head_dim}")
        self.block = block

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return CirculantSTRINGLayer(self.num_heads, self.head_dim, self.geometry.pos_dim, self.block, self.options.base)
