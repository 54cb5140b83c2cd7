"""Submanifold sparse 3D convolution: PTv3's stem and its conditional positional encoding (xCPE).

A submanifold convolution evaluates a K x K x K kernel only at occupied voxels and reads only
occupied neighbours, so the set of active sites never grows. Two backends, chosen here and
nowhere else:

* ``torch`` (CPU, and CUDA without spconv): every voxel gets one int64 key; the keys are
  sorted once and all K^3 neighbour offsets are looked up with one ``searchsorted``, giving an
  (N, K^3) neighbour table; the output is gather -> one matmul. Pure autograd, so gradients
  are exact; it is tested against dense ``conv3d``.
* ``spconv`` (CUDA with the optional spconv package): what PTv3 uses on GPU. Its CPU build is
  not used: backward asks torch.cuda for a stream, eval with bias asserts, and with more
  than one thread its forward is randomly wrong (issue 8 measured errors up to ~0.5).

Both hold the same parameters (``weight`` (K^3, C_in, C_out) in conv3d's offset order, and
``bias``), so a checkpoint trained with one runs with the other.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor, nn

#: coordinates are shifted by this before packing into a key, so offsets of -K/2 stay >= 0
_MARGIN = 8
_AXIS_BITS = 16  # 65536 voxels per axis (655 m at 1 cm); leaves 15 bits for the batch index


def voxel_keys(grid_coord: Tensor, batch: Tensor) -> Tensor:
    """One int64 per voxel: batch index in the high bits, then x, y, z (16 bits each)."""
    c = grid_coord.long() + _MARGIN
    return (((batch.long() << _AXIS_BITS | c[:, 0]) << _AXIS_BITS | c[:, 1]) << _AXIS_BITS) | c[:, 2]


def kernel_offsets(kernel_size: int, device: torch.device | None = None) -> Tensor:
    """(K^3, 3) offsets in the order of conv3d's weight[:, :, i, j, l] flattened."""
    r = torch.arange(kernel_size, device=device) - kernel_size // 2
    return torch.stack(torch.meshgrid(r, r, r, indexing="ij"), dim=-1).reshape(-1, 3)


def neighbour_table(grid_coord: Tensor, batch: Tensor, kernel_size: int) -> Tensor:
    """(N, K^3) row of the occupied neighbour at each kernel offset, N (a zero row) if empty.

    Voxels must be unique per batch element (grid sampling guarantees it).
    """
    n = grid_coord.shape[0]
    if n and (int(grid_coord.max()) + _MARGIN + kernel_size >= 1 << _AXIS_BITS or int(batch.max()) >= 1 << 15):
        raise ValueError(
            f"sparse conv keys hold grid coordinates below {(1 << _AXIS_BITS) - 2 * _MARGIN} and 32768 samples"
        )
    keys = voxel_keys(grid_coord, batch)
    sorted_keys, order = torch.sort(keys)
    offsets = kernel_offsets(kernel_size, grid_coord.device)
    shifted = voxel_keys((grid_coord[:, None, :] + offsets).reshape(-1, 3), batch.repeat_interleave(len(offsets)))
    slot = torch.searchsorted(sorted_keys, shifted).clamp_max(max(n - 1, 0))
    found = sorted_keys[slot] == shifted
    return torch.where(found, order[slot], n).view(n, len(offsets))


def spconv_available(device: torch.device) -> bool:
    return device.type == "cuda" and _import_spconv() is not None


@lru_cache(maxsize=1)
def _import_spconv():  # noqa: ANN202  (module or None)
    try:
        import spconv.pytorch as spconv
    except ImportError:
        return None
    return spconv


class SubMConv3d(nn.Module):
    """Submanifold conv on points with integer ``grid_coord`` (N, 3) and ``batch`` (N,).

    ``backend``: "auto" (spconv on CUDA when installed, else torch), "torch" or "spconv".
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int = 3, bias: bool = True, backend: str = "auto"
    ) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"submanifold kernels must be odd, got {kernel_size}")
        self.kernel_size = kernel_size
        self.backend = backend
        self.weight = nn.Parameter(torch.empty(kernel_size**3, in_channels, out_channels))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        # conv3d's default (Kaiming uniform with a = sqrt(5)), so both references start alike
        bound = 1.0 / math.sqrt(in_channels * kernel_size**3)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, feat: Tensor, grid_coord: Tensor, batch: Tensor, table: Tensor | None = None) -> Tensor:
        use_spconv = self.backend == "spconv" or (self.backend == "auto" and spconv_available(feat.device))
        if use_spconv:
            return self._forward_spconv(feat, grid_coord, batch)
        if table is None:
            table = neighbour_table(grid_coord, batch, self.kernel_size)
        # One gather and one matmul (not a loop over offsets): on a loaded CPU every parallel
        # op pays a thread-synchronisation cost, and a per-offset index_add loop paid it K^3
        # times per layer (measured 100x slower than this at 2 threads).
        padded = torch.cat([feat, feat.new_zeros(1, feat.shape[1])])
        gathered = padded[table].reshape(feat.shape[0], -1)
        out = gathered @ self.weight.to(feat.dtype).reshape(-1, self.weight.shape[-1])
        return out if self.bias is None else out + self.bias.to(feat.dtype)

    def _forward_spconv(self, feat: Tensor, grid_coord: Tensor, batch: Tensor) -> Tensor:
        spconv = _import_spconv()
        if spconv is None:
            raise RuntimeError("backend='spconv' needs the optional spconv package (and CUDA)")
        k = self.kernel_size
        c_in, c_out = self.weight.shape[1:]
        indices = torch.cat([batch[:, None], grid_coord], dim=1).int()
        shape = (grid_coord.max(0).values + k).tolist()
        x = spconv.SparseConvTensor(feat, indices, shape, int(batch.max()) + 1)
        conv = _spconv_layer(c_in, c_out, k, feat.device)
        # spconv's own weight layout differs across versions ((C_out, K, K, K, C_in) from 2.2,
        # (K, K, K, C_in, C_out) before); functional_call keeps the autograd link to ours.
        weight = self.weight.reshape(k, k, k, c_in, c_out)
        if tuple(conv.weight.shape) != tuple(weight.shape):
            weight = weight.permute(4, 0, 1, 2, 3)
        y = torch.func.functional_call(conv, {"weight": weight.contiguous()}, (x,)).features
        return y if self.bias is None else y + self.bias


@lru_cache(maxsize=32)
def _spconv_layer(c_in: int, c_out: int, kernel_size: int, device: torch.device) -> nn.Module:
    """A parameter-less-in-practice spconv layer: its weight is always substituted."""
    spconv = _import_spconv()
    return spconv.SubMConv3d(c_in, c_out, kernel_size, bias=False, indice_key=None).to(device)
