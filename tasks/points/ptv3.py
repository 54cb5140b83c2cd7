"""A Point Transformer V3-style backbone (Wu et al., CVPR 2024) on pe-bench's attention core.

Structure (PTv3 Fig. 1/Section 3): voxelised points -> sparse-conv stem -> encoder stages
(grid pooling by ``stride``, then blocks) -> either a U-Net decoder (grid unpooling with skip
connections, then blocks) for segmentation or global average pooling for classification.
A block is: optional xCPE (submanifold conv + linear + LayerNorm, residual), then the shared
pre-norm :class:`~pe_bench.harness.blocks.EncoderBlock` run on *patches*: the points,
sorted along the block's space-filling curve, are cut into patches that become the batch
dimension (patches, patch_size, D); padding slots are masked keys.

Where the encoding under test enters: every attention layer sees each token's metric
position (x, y, z) times ``position_scale`` (default 1 / grid_size: one unit = one stem voxel)
for queries and keys. Positions are the scene/object frame coordinates, not re-centred per
patch, so absolute encodings (sincos) can see absolute height; relative encodings are
unaffected by the frame. One encoding instance per stage (stages differ in width and
heads), ``depth`` = blocks of that stage; its ``prepare``/``embed`` run at the input of the
stage on the per-sample point sets (CAPE's augmentation and sincos's addition act per
stage, as the positions of a pooled stage are new tokens).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from pe_bench.adapters import EncodingFactory, Geometry, PositionEncoding, PositionLayout
from pe_bench.harness.blocks import EncoderBlock
from pe_bench.harness.config import Strict
from pe_bench.tasks._shared.grouping import (
    Clusters,
    grid_pool,
    grid_unpool,
    make_patches,
    padded_per_sample,
    segment_reduce,
)
from pe_bench.tasks._shared.serialization import ORDERS, serialize

from .sparse_conv import SubMConv3d, neighbour_table


class PTv3Config(Strict):
    """Stage structure (the points tasks' ``model.ptv3`` section); defaults are PTv3's official
    ScanNet/ModelNet40 configuration."""

    enc_depths: list[int] = [2, 2, 2, 6, 2]
    enc_channels: list[int] = [32, 64, 128, 256, 512]
    enc_num_head: list[int] = [2, 4, 8, 16, 32]
    dec_depths: list[int] = [2, 2, 2, 2]
    dec_channels: list[int] = [64, 64, 128, 256]
    dec_num_head: list[int] = [4, 4, 8, 16]
    stride: int = 2
    order: list[str] = list(ORDERS)
    shuffle_orders: bool = True
    stem_kernel: int = 5
    cpe: Literal["sparse-conv", "none"] = "sparse-conv"
    conv_backend: Literal["auto", "torch", "spconv"] = "auto"
    position_scale: float | None = None  # None: 1 / grid_size

    def check(self, decoder: bool) -> None:
        if not (len(self.enc_depths) == len(self.enc_channels) == len(self.enc_num_head)):
            raise ValueError("model.ptv3: enc_depths, enc_channels and enc_num_head need one entry per stage")
        if decoder and not (len(self.dec_depths) == len(self.dec_channels) == len(self.dec_num_head)):
            raise ValueError("model.ptv3: dec_depths, dec_channels and dec_num_head need one entry per stage")
        if decoder and len(self.dec_depths) != len(self.enc_depths) - 1:
            raise ValueError("model.ptv3: a U-Net needs one decoder stage fewer than encoder stages")
        unknown = [o for o in self.order if o not in ORDERS]
        if unknown:
            raise ValueError(f"model.ptv3.order: unknown {unknown}; orders: {', '.join(ORDERS)}")


class PointBatch:
    """Flat points of a batch: ``coord`` (N, 3) metric, ``grid_coord`` (N, 3) int voxels,
    ``batch`` (N,) element index, ``feat`` (N, C). Caches per-stage neighbour tables."""

    def __init__(self, coord: Tensor, grid_coord: Tensor, batch: Tensor, feat: Tensor) -> None:
        self.coord, self.grid_coord, self.batch, self.feat = coord, grid_coord, batch, feat
        self._tables: dict[int, Tensor] = {}

    def table(self, kernel_size: int) -> Tensor:
        if kernel_size not in self._tables:
            self._tables[kernel_size] = neighbour_table(self.grid_coord, self.batch, kernel_size)
        return self._tables[kernel_size]

    def with_feat(self, feat: Tensor) -> PointBatch:
        """Same points, new features; the neighbour tables are shared, not rebuilt."""
        out = PointBatch(self.coord, self.grid_coord, self.batch, feat)
        out._tables = self._tables
        return out


class Norm(nn.Module):
    """BatchNorm over points (PTv3 uses BN in stem, pooling and unpooling)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(x)


class ConditionalPE(nn.Module):
    """xCPE: submanifold conv -> linear -> LayerNorm, added to the features."""

    def __init__(self, channels: int, backend: str) -> None:
        super().__init__()
        self.conv = SubMConv3d(channels, channels, 3, bias=True, backend=backend)
        self.linear = nn.Linear(channels, channels)
        self.norm = nn.LayerNorm(channels)

    def forward(self, points: PointBatch) -> Tensor:
        y = self.conv(points.feat, points.grid_coord, points.batch, points.table(3))
        return points.feat + self.norm(self.linear(y))


class Stage(nn.Module):
    """Blocks of one resolution, each on its own serialization order's patches."""

    def __init__(
        self,
        encoding: PositionEncoding,
        dim: int,
        heads: int,
        depth: int,
        drop_path: list[float],
        cfg: PTv3Config,
        mlp_ratio: float,
        patch_size: int,
        position_scale: float,
    ) -> None:
        super().__init__()
        self.encoding = encoding
        self.patch_size = patch_size
        self.position_scale = position_scale
        self.shuffle = cfg.shuffle_orders
        self.orders = tuple(cfg.order)
        self.cpe = nn.ModuleList(
            ConditionalPE(dim, cfg.conv_backend) if cfg.cpe == "sparse-conv" else nn.Identity() for _ in range(depth)
        )
        self.blocks = nn.ModuleList(
            EncoderBlock(dim, heads, encoding, i, mlp_ratio, drop_path[i]) for i in range(depth)
        )

    def forward(self, points: PointBatch) -> PointBatch:
        if not self.blocks:
            return points
        coords, feat = self._prepare(points)
        perms = serialize(points.grid_coord, points.batch, self.orders)
        if self.shuffle and self.training:
            # PTv3 shuffles which curve each block uses, per forward pass.
            perms = perms[torch.randperm(len(self.orders), device=perms.device)]
        for i, (cpe, block) in enumerate(zip(self.cpe, self.blocks, strict=True)):
            if not isinstance(cpe, nn.Identity):
                feat = cpe(points.with_feat(feat))
            patches = make_patches(perms[i % len(perms)], points.batch, self.patch_size)
            valid = patches.valid
            layout = PositionLayout(coords=patches.gather(coords), has_pos=valid, valid=valid)
            feat = patches.scatter(block(patches.gather(feat), layout))
        return points.with_feat(feat)

    def _prepare(self, points: PointBatch) -> tuple[Tensor, Tensor]:
        """The encoding's once-per-input hooks, per sample: positions (N, 3) and features."""
        scaled = points.coord * self.position_scale
        both = torch.cat([scaled, points.feat], dim=-1)
        padded, valid, slot = padded_per_sample(both, points.batch)
        layout = PositionLayout(coords=padded[..., :3], has_pos=valid, valid=valid)
        layout = self.encoding.prepare(layout)
        x = self.encoding.embed(padded[..., 3:], layout)
        flat = lambda t: t.reshape(-1, t.shape[-1])[slot]  # noqa: E731
        return flat(layout.coords).to(points.coord.dtype), flat(x)


class Stem(nn.Module):
    """PTv3's embedding: a K^3 submanifold conv (K = 5), BatchNorm, GELU."""

    def __init__(self, in_channels: int, channels: int, kernel_size: int, backend: str) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = SubMConv3d(in_channels, channels, kernel_size, bias=False, backend=backend)
        self.norm = Norm(channels)
        self.act = nn.GELU()

    def forward(self, points: PointBatch) -> PointBatch:
        y = self.conv(points.feat, points.grid_coord, points.batch, points.table(self.kernel_size))
        return points.with_feat(self.act(self.norm(y)))


class Pooling(nn.Module):
    """Grid pooling: linear projection, then max over the children of each parent voxel."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.proj = nn.Linear(in_channels, out_channels)
        self.norm = Norm(out_channels)
        self.act = nn.GELU()

    def forward(self, points: PointBatch) -> tuple[PointBatch, Clusters]:
        clusters = grid_pool(points.grid_coord, points.batch, points.coord, self.stride)
        feat = segment_reduce(self.proj(points.feat), clusters.inverse, len(clusters.batch), "amax")
        parent = PointBatch(clusters.coord, clusters.grid_coord, clusters.batch, self.act(self.norm(feat)))
        return parent, clusters


class Unpooling(nn.Module):
    """Grid unpooling with a skip connection: proj(parent)[child's parent] + proj_skip(child)."""

    def __init__(self, in_channels: int, skip_channels: int, out_channels: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(in_channels, out_channels), Norm(out_channels), nn.GELU())
        self.proj_skip = nn.Sequential(nn.Linear(skip_channels, out_channels), Norm(out_channels), nn.GELU())

    def forward(self, parent: PointBatch, skip: PointBatch, clusters: Clusters) -> PointBatch:
        return skip.with_feat(grid_unpool(self.proj(parent.feat), clusters) + self.proj_skip(skip.feat))


class PTv3(nn.Module):
    """The backbone. ``mode="seg"``: per-point features (U-Net); ``"cls"``: per-sample features
    (encoder, then mean over each sample's points)."""

    #: voxel pooling, serialization and patching size tensors by the data: ``trainer.compile``
    #: compiles each transformer block, not the whole forward (``harness/compile.py``)
    compiles_per_block = True

    def __init__(
        self,
        make_encoding: EncodingFactory,
        geometry: Geometry,
        cfg: PTv3Config,
        in_channels: int,
        grid_size: float,
        mode: Literal["seg", "cls"],
        patch_size: int = 1024,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.3,
    ) -> None:
        super().__init__()
        cfg.check(decoder=mode == "seg")
        self.mode = mode
        scale = cfg.position_scale if cfg.position_scale is not None else 1.0 / grid_size
        self.geometry = geometry
        # PTv3's stochastic depth: 0 -> drop_path over the encoder blocks, and separately over
        # the decoder blocks with the deepest decoder stage getting the largest rates.
        enc_rates = _linspace(drop_path, sum(cfg.enc_depths))
        dec_rates = _linspace(drop_path, sum(cfg.dec_depths))

        def stage(dim: int, heads: int, depth: int, rates: list[float]) -> Stage:
            encoding = make_encoding(self.geometry, dim, heads, max(depth, 1))
            return Stage(encoding, dim, heads, depth, rates, cfg, mlp_ratio, patch_size, scale)

        ch, heads = cfg.enc_channels, cfg.enc_num_head
        self.stem = Stem(in_channels, ch[0], cfg.stem_kernel, cfg.conv_backend)
        self.pools = nn.ModuleList(Pooling(ch[s - 1], ch[s], cfg.stride) for s in range(1, len(ch)))
        ed = cfg.enc_depths
        self.enc = nn.ModuleList(
            stage(ch[s], heads[s], ed[s], enc_rates[sum(ed[:s]) : sum(ed[: s + 1])]) for s in range(len(ch))
        )
        self.out_channels = ch[-1]
        if mode == "seg":
            dch, dheads, ddepths = cfg.dec_channels, cfg.dec_num_head, cfg.dec_depths
            self.unpools = nn.ModuleList(
                Unpooling(dch[s + 1] if s + 1 < len(dch) else ch[-1], ch[s], dch[s]) for s in range(len(dch))
            )
            self.dec = nn.ModuleList(
                stage(dch[s], dheads[s], ddepths[s], dec_rates[sum(ddepths[:s]) : sum(ddepths[: s + 1])][::-1])
                for s in range(len(dch))
            )
            self.out_channels = dch[0]

    def forward(self, points: PointBatch) -> Tensor:
        points = self.enc[0](self.stem(points))
        skips, clusters = [points], []
        for pool, stage in zip(self.pools, self.enc[1:], strict=True):
            points, parents = pool(points)
            points = stage(points)
            skips.append(points)
            clusters.append(parents)
        if self.mode == "cls":
            return segment_reduce(points.feat, points.batch, int(points.batch.max()) + 1, "mean")
        for s in reversed(range(len(self.dec))):
            points = self.dec[s](self.unpools[s](points, skips[s], clusters[s]))
        return points.feat


def _linspace(end: float, count: int) -> list[float]:
    return torch.linspace(0, end, count).tolist() if count > 1 else [end] * count


def points_geometry(grid_size: float, position_scale: float) -> Geometry:
    """Irregular 3D positions (so grid-only encodings are n/a)."""
    unit = grid_size if abs(position_scale * grid_size - 1.0) < 1e-9 else 1.0 / position_scale
    return Geometry(pos_dim=3, grid_shape=None, units=f"{unit:g} m", num_prefix_tokens=0)
