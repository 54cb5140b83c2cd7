"""Circulant-STRING (Schenck et al., "Learning the RoPEs: Better 2D and 3D Position Encodings
with STRING", arXiv 2502.02562, Section 3.2, Example 2 and Theorem 3.5).

Generators L_k = C_k - C_k^T with C_k circulant, one per position axis k, per layer and head;
z -> exp(Σ_k r_k L_k) z. As in the paper's experiments (Appendix E) the head is split into
blocks of ``block_size`` channels, each with its own circulant generators (block-diagonal L_k).

Fourier form: an antisymmetric circulant with first column u (u[m] = c[m] - c[-m]) is
diagonalised by the DFT with purely imaginary eigenvalues i φ, φ = Im(DFT u), so

    exp(Σ_k r_k L_k) z = IDFT( exp(i Σ_k r_k φ_k) ⊙ DFT z )    (Theorem 3.5's FFT form)
                       = F^T RoPE(θ) F z,   θ = Σ_k r_k φ_k,

F the real orthonormal Fourier basis of each block (the DC row, a (sin, cos) row pair per
rotating plane, the Nyquist row for even b; ``fourier_basis``), whose pairs RoPE turns by θ.
Every block's L_k shares this F whatever u is: F is fixed, only the phases φ are learned.
F^T cancels in the attention score, <F^T R_i F q, F^T R_j F k> = <R_i F q, R_j F k>, as
P's inverse does for Cayley-STRING (_string.py), so q and k are encoded as RoPE(θ) F z:
one (d x d) matrix product and a rotation, in the input's dtype (the FFT form ran in
float32 with complex numbers, which neither 16-bit autocast nor compilers fuse). The DC
and (even b) Nyquist rows have φ = 0 and never rotate; the other b/2 - 1 (odd b:
(b-1)/2) planes rotate. ``fourier_basis`` and the FFT form give the same scores (tested).

Parameters: u's free entries u[1..(b-1)//2] per block, axis and head (u[0] and u[b/2] are
0 and u[-m] = -u[m] for any C - C^T, so these determine L_k exactly and each one gets a
gradient; the paper's c_0 cancels in C - C^T and would never learn). The functions reachable
are the paper's, the training dynamics not quite: with the paper's c, u[m] = c[m] - c[-m]
gets two opposite updates a step, so under Adam (and SGD) u moves about twice as fast as
here, and weight decay pulls on c rather than u. A baseline trained here is therefore
Circulant-STRING at half its phases' learning rate, compared with the paper's parameters.

Initialisation (the paper gives none): u is chosen so that the rotating Fourier planes carry
axial RoPE's frequency ladder: plane j turns with axis j // levels at base^(-(j % levels) /
levels), levels = planes // P (leftover planes start at 0 and may learn). By Theorem 3.4 this
is exactly axial RoPE in the blockwise Fourier basis: the start of Cayley-STRING in kind, with
fewer levels, since a block of b channels has (b - 1) // 2 rotating planes where Cayley's
b / 2 pairs all rotate (head width 16: 3 levels per axis against Cayley's 4, one plane idle;
64: 14 against 16).

CLS: as in _string.py, the identity rotation at the centroid of the valid keys (after F, which no score sees).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor, nn

from ._string import BasisPlacement, STRINGEncoding, STRINGLayer, STRINGOptions
from .base import LayerEncoding
from .registry import register


class CirculantSTRINGOptions(STRINGOptions):
    block_size: int = Field(16, ge=3)  # Appendix E: 16 was best on ImageNet; capped at head_dim


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


def fourier_basis(block: int, blocks: int) -> Tensor:
    """The real orthonormal Fourier basis F of ``blocks`` blocks of ``block`` channels, (d, d):
    first every block's rotating planes as (sin, cos) row pairs, plane k of block j turning
    by the phase φ[j, k] (``phases``' order, DC left out), then every block's DC row, then
    (even ``block``) every block's Nyquist row. With this row order RoPE(θ) F z is F times
    the FFT form (module doc): (S, C) = (Σ z_m sin 2πkm/b, Σ z_m cos 2πkm/b) is turned by θ
    exactly as multiplying the spectrum C - iS by e^{iθ} turns it."""
    m = torch.arange(block, dtype=torch.float64)
    turns = 2 * math.pi * torch.arange(1, (block - 1) // 2 + 1, dtype=torch.float64)[:, None] * m / block
    pair_rows = math.sqrt(2.0 / block) * torch.stack([turns.sin(), turns.cos()], 1).flatten(0, 1)
    kinds = [pair_rows, torch.full((1, block), block**-0.5, dtype=torch.float64)]  # the planes, DC
    if block % 2 == 0:
        kinds.append(((-1.0) ** m * block**-0.5)[None])  # Nyquist
    basis = torch.zeros(blocks * block, blocks * block, dtype=torch.float64)
    start = 0
    for rows in kinds:  # every block's rows of one kind before the next kind
        for j in range(blocks):
            basis[start : start + rows.shape[0], j * block : (j + 1) * block] = rows
            start += rows.shape[0]
    return basis  # float64: STRINGLayer casts it to q's dtype once per call


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
    def __init__(
        self, num_heads: int, head_dim: int, pos_dim: int, block: int, base: float, basis: BasisPlacement
    ) -> None:
        super().__init__(basis)
        self.block = block
        self.blocks = head_dim // block
        n_free = (block - 1) // 2
        phi = initial_phases(num_heads, pos_dim, self.blocks, n_free, base)
        self.u_free = nn.Parameter(free_entries_for(phi, block))  # (H, P, blocks, n_free)
        self.register_buffer("basis", fourier_basis(block, self.blocks), persistent=False)

    def qk_basis(self) -> Tensor:
        return self.basis

    def rotation_frequencies(self) -> Tensor:
        rotating = phases(self.u_free, self.block)[..., 1 : self.u_free.shape[-1] + 1]  # (H, P, blocks, n_free)
        return rotating.flatten(-2)


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
        options, pos_dim = self.options, self.geometry.pos_dim
        return CirculantSTRINGLayer(self.num_heads, self.head_dim, pos_dim, self.block, options.base, options.basis)
