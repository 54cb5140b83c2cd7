"""Space-filling-curve serialization of voxelised points (PTv3 Section 3.1).

A curve maps each integer voxel (x, y, z) to a code; sorting points by (batch, code) turns
the cloud into a sequence in which neighbours in the sequence are mostly neighbours in
space, so fixed-size chunks of it (patches) are local. PTv3 uses four orders - z-order,
Hilbert, and both with x and y swapped ("-trans") - and gives successive blocks different
orders so that patch borders move and information crosses them.
"""

from __future__ import annotations

import torch
from torch import Tensor

ORDERS = ("z", "z-trans", "hilbert", "hilbert-trans")
MAX_BITS = 16  # 3 x 16 code bits + batch bits fit an int64


def bits_for(grid_coord: Tensor) -> int:
    """Bits per axis needed for the largest coordinate (at least 1)."""
    top = int(grid_coord.max()) if grid_coord.numel() else 0
    bits = max(top.bit_length(), 1)
    if bits > MAX_BITS:
        raise ValueError(f"grid coordinates up to {top} need {bits} bits per axis, more than {MAX_BITS}")
    return bits


def _interleave(x: Tensor, bits: int) -> Tensor:
    """(N, 3) non-negative ints -> codes taking one bit of x[:, 0], x[:, 1], x[:, 2] per level,
    most significant level first (x[:, 0] the most significant of each triple)."""
    code = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    for b in range(bits - 1, -1, -1):
        for axis in range(3):
            code = (code << 1) | ((x[:, axis] >> b) & 1)
    return code


def z_order(grid_coord: Tensor, bits: int) -> Tensor:
    """Morton code: the bits of x, y and z interleaved."""
    return _interleave(grid_coord.long(), bits)


def hilbert(grid_coord: Tensor, bits: int) -> Tensor:
    """3D Hilbert index by Skilling's transpose algorithm (AIP Conf. Proc. 707, 2004), vectorised.

    Consecutive codes of a full grid are always face-adjacent voxels, which z-order is not.
    """
    x = grid_coord.long().clone()
    q = 1 << (bits - 1)
    while q > 1:  # undo excess work: per level, reflect/exchange the lower bits
        p = q - 1
        for axis in range(3):
            high = (x[:, axis] & q) != 0
            if axis == 0:
                x[:, 0] = torch.where(high, x[:, 0] ^ p, x[:, 0])
                continue
            swap = (x[:, 0] ^ x[:, axis]) & p
            x0 = torch.where(high, x[:, 0] ^ p, x[:, 0] ^ swap)
            x[:, axis] = torch.where(high, x[:, axis], x[:, axis] ^ swap)
            x[:, 0] = x0
        q >>= 1
    for axis in (1, 2):  # Gray encode
        x[:, axis] ^= x[:, axis - 1]
    t = torch.zeros_like(x[:, 0])
    q = 1 << (bits - 1)
    while q > 1:
        t = torch.where((x[:, 2] & q) != 0, t ^ (q - 1), t)
        q >>= 1
    return _interleave(x ^ t[:, None], bits)


def encode(grid_coord: Tensor, batch: Tensor, order: str, bits: int | None = None) -> Tensor:
    """Codes that sort points by batch element first, then along the curve ``order``."""
    if order not in ORDERS:
        raise ValueError(f"unknown serialization order {order!r}; orders: {', '.join(ORDERS)}")
    bits = bits or bits_for(grid_coord)
    coords = grid_coord[:, [1, 0, 2]] if order.endswith("-trans") else grid_coord
    code = (z_order if order.startswith("z") else hilbert)(coords, bits)
    return (batch.long() << (3 * bits)) | code


def serialize(grid_coord: Tensor, batch: Tensor, orders: tuple[str, ...]) -> Tensor:
    """(len(orders), N) permutations: ``perm[i]`` lists the points along curve ``orders[i]``."""
    bits = bits_for(grid_coord)
    return torch.stack([torch.argsort(encode(grid_coord, batch, o, bits)) for o in orders])
