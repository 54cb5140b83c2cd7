"""A UniTR-style camera + LiDAR transformer (Wang et al., "UniTR: A Unified and Efficient
Multi-Modal Transformer for Bird's-Eye-View Representation", ICCV 2023, arXiv:2308.07732).

Tokens: LiDAR points are voxelised (a dynamic voxel encoder pools per-point features into
one token per non-empty voxel, like UniTR's DynPillarVFE) and camera images are cut into
patches (a strided convolution, like UniTR's PatchEmbed). Then, on pe-bench's attention
core:

1. intra-modal blocks: each modality attends within its own sets. LiDAR sets are runs of
   ``lidar_set_size`` voxels along a space-filling curve of the voxel grid (the point-cloud
   family's serialization, in ``tasks/_shared``; UniTR uses DSVT's rotated-window sets),
   camera sets runs of ``camera_set_size`` patches of one view. Block i uses curve
   ``orders[i % len(orders)]`` so that set borders move between blocks.
2. inter-modal blocks: LiDAR voxels and camera patches of a sample in one token sequence,
   cut into sets of ``inter_set_size`` along a curve of the 3-D voxel grid, each image
   patch placed where it is lifted to (see :class:`ImageLifter`). A learned modality
   embedding tells the two kinds of token apart.
3. the LiDAR tokens are scattered to a bird's-eye-view map (max over the voxels of a
   column); the BEV head reads only that map, so camera evidence reaches the detections
   only through the inter-modal attention (UniTR's configuration without the LSS branch).

Where the encoding under test enters: one encoding per attention stack (LiDAR intra-modal,
3-D; camera intra-modal, 2-D; inter-modal, 3-D). Positions: voxel centres (x, y, z) for
LiDAR tokens; for camera tokens, the (row, column) of the patch in the intra-modal blocks
and the lifted 3-D point in the inter-modal blocks. 3-D positions are metres times
``position_scale`` (one unit = one BEV cell by default), patch positions are in patches.
Token features carry no absolute position (voxel features are offsets inside the voxel and
intensity), so an encoding is the only way a token learns where it is.

Differences from UniTR: no 2-D inter-modal blocks (UniTR's LiDAR-to-image sets); separate
weights for the two modalities' intra-modal blocks (UniTR shares them; here each stack owns
its encoding, whose geometry differs); image patches are lifted to LiDAR depth rather than
to UniTR's nearest projected BEV reference point.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pe_bench.adapters import EncodingFactory, Geometry, PositionEncoding, PositionLayout
from pe_bench.harness.blocks import EncoderBlock
from pe_bench.harness.config import Strict
from pe_bench.tasks._shared.grouping import grid_pool, make_patches, padded_per_sample, segment_reduce
from pe_bench.tasks._shared.serialization import ORDERS, serialize

from .calibration import lift, project

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class UniTRConfig(Strict):
    """The backbone's structure (the nuscenes task's ``model.unitr`` section)."""

    intra_depth: int = 2  # blocks per modality before fusion
    inter_depth: int = 6  # camera + LiDAR blocks
    lidar_set_size: int = 90
    camera_set_size: int = 90
    inter_set_size: int = 90
    orders: list[str] = ["z", "z-trans"]
    position_scale: float | None = None  # None: 1 / the BEV cell size (x voxel size)
    fallback_depth: float = 30.0  # metres, for image patches of a view no LiDAR point reaches

    def check(self) -> None:
        unknown = [o for o in self.orders if o not in ORDERS]
        if unknown:
            raise ValueError(f"model.unitr.orders: unknown {unknown}; orders: {', '.join(ORDERS)}")
        if min(self.lidar_set_size, self.camera_set_size, self.inter_set_size) < 1:
            raise ValueError("model.unitr: set sizes must be >= 1")


class VoxelGrid(Strict):
    """The LiDAR range and voxel size (metres), shared by the voxeliser, the BEV map and the head."""

    point_range: tuple[float, float, float, float, float, float]  # x, y, z min, then x, y, z max
    voxel_size: tuple[float, float, float]

    @property
    def shape(self) -> tuple[int, int, int]:
        lo, hi, size = self.point_range[:3], self.point_range[3:], self.voxel_size
        x, y, z = (round((hi[i] - lo[i]) / size[i]) for i in range(3))
        return x, y, z

    def lower(self, device: torch.device | None = None) -> Tensor:
        return torch.tensor(self.point_range[:3], device=device)

    def size(self, device: torch.device | None = None) -> Tensor:
        return torch.tensor(self.voxel_size, device=device)

    def cells(self, xyz: Tensor) -> Tensor:
        """Metric (N, 3) -> integer voxel coordinates (N, 3), unclamped."""
        return torch.floor((xyz - self.lower(xyz.device)) / self.size(xyz.device)).long()

    def inside(self, cells: Tensor) -> Tensor:
        return ((cells >= 0) & (cells < torch.tensor(self.shape, device=cells.device))).all(dim=-1)


class DynamicVoxelEncoder(nn.Module):
    """Two PointNet layers pooled per voxel (UniTR/PointPillars' PFN), on position-free point
    features: offset to the voxel's mean point and to the voxel centre (in voxel sizes) and
    the point's remaining channels (intensity, ...)."""

    def __init__(self, point_channels: int, dim: int) -> None:
        super().__init__()
        in_channels = 6 + point_channels - 3
        self.first = nn.Sequential(nn.Linear(in_channels, dim // 2, bias=False), nn.BatchNorm1d(dim // 2), nn.ReLU())
        self.second = nn.Sequential(nn.Linear(dim, dim, bias=False), nn.BatchNorm1d(dim), nn.ReLU())

    def forward(self, features: Tensor, inverse: Tensor, voxels: int) -> Tensor:
        x = self.first(features)
        x = torch.cat([x, segment_reduce(x, inverse, voxels, "amax")[inverse]], dim=-1)
        return segment_reduce(self.second(x), inverse, voxels, "amax")


class Voxels:
    """Non-empty voxels of a batch: ``cells`` (M, 3) int, ``batch`` (M,), ``centres`` (M, 3) m."""

    def __init__(self, cells: Tensor, batch: Tensor, centres: Tensor) -> None:
        self.cells, self.batch, self.centres = cells, batch, centres


def voxelise(points: Tensor, batch: Tensor, grid: VoxelGrid) -> tuple[Voxels, Tensor, Tensor, Tensor]:
    """Points (N, C >= 3) -> voxels, and for the points inside the range: point features for
    :class:`DynamicVoxelEncoder`, their voxel row and the kept-point mask."""
    cells = grid.cells(points[:, :3])
    keep = grid.inside(cells)
    points, cells, batch = points[keep], cells[keep], batch[keep]
    clusters = grid_pool(cells, batch, points[:, :3], stride=1)
    size = grid.size(points.device)
    centres = (clusters.grid_coord.float() + 0.5) * size + grid.lower(points.device)
    features = torch.cat(
        [
            (points[:, :3] - clusters.coord[clusters.inverse]) / size,
            (points[:, :3] - centres[clusters.inverse]) / size,
            points[:, 3:],
        ],
        dim=-1,
    )
    return Voxels(clusters.grid_coord, clusters.batch, centres), features, clusters.inverse, keep


class ImageLifter(nn.Module):
    """3-D positions of image patches from the LiDAR points of the same sample.

    Every LiDAR point is projected into every view; a patch takes the smallest depth of the
    points that fall inside it (the surface the camera sees there), a patch that no point
    reaches the depth of the nearest patch (on the patch grid) that one reaches, and a view
    that no point reaches ``fallback_depth``. The patch centre's ray at that depth is the
    patch's 3-D position. No parameters: this is geometry, as UniTR's image-to-LiDAR mapping.
    """

    def __init__(self, patch_size: int, fallback_depth: float, min_depth: float = 0.5) -> None:
        super().__init__()
        self.patch_size, self.fallback_depth, self.min_depth = patch_size, fallback_depth, min_depth

    @torch.no_grad()
    def forward(
        self, points: Tensor, batch: Tensor, K: Tensor, cam_to_ego: Tensor, image_hw: tuple[int, int]
    ) -> Tensor:
        """points (N, >=3), batch (N,), K (B, V, 3, 3), cam_to_ego (B, V, 4, 4) -> (B, V, h, w, 3)."""
        b_size, views = K.shape[:2]
        rows, cols = image_hw[0] // self.patch_size, image_hw[1] // self.patch_size
        v_idx, u_idx = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        cell = torch.stack([v_idx.reshape(-1), u_idx.reshape(-1)], dim=-1).to(K.device, K.dtype)  # (h*w, 2)
        centres = (cell.flip(-1) + 0.5) * self.patch_size  # (u, v) pixels
        depth = torch.full((b_size, views, rows * cols), self.fallback_depth, device=K.device, dtype=K.dtype)
        for b in range(b_size):
            xyz = points[batch == b, :3].to(K.dtype)
            pixels, z = project(xyz.expand(views, -1, -1), K[b], cam_to_ego[b])  # (V, N, 2), (V, N)
            inside = (z > self.min_depth) & (pixels >= 0).all(-1)
            inside &= (pixels[..., 0] < cols * self.patch_size) & (pixels[..., 1] < rows * self.patch_size)
            for v in range(views):
                px, zv = pixels[v, inside[v]], z[v, inside[v]]
                if not len(zv):
                    continue
                patch = (px[:, 1] // self.patch_size).long() * cols + (px[:, 0] // self.patch_size).long()
                nearest = torch.full((rows * cols,), torch.inf, device=K.device, dtype=K.dtype)
                nearest = nearest.scatter_reduce(0, patch, zv, reduce="amin")
                reached = torch.isfinite(nearest)
                if not reached.all():
                    gap = torch.cdist(cell[~reached], cell[reached]).argmin(dim=1)
                    nearest[~reached] = nearest[reached][gap]
                depth[b, v] = nearest
        lifted = lift(centres.expand(b_size, views, -1, -1), depth, K, cam_to_ego)
        return lifted.view(b_size, views, rows, cols, 3)


class SetAttentionStack(nn.Module):
    """Blocks of self-attention inside sets of tokens: tokens of each group (sample, or view)
    sorted along a space-filling curve of their integer cells and cut into sets of at most
    ``set_size`` (the sets are the batch; padded slots are masked keys)."""

    def __init__(
        self,
        encoding: PositionEncoding,
        dim: int,
        num_heads: int,
        depth: int,
        set_size: int,
        orders: list[str],
        mlp_ratio: float,
        drop_path: float,
    ) -> None:
        super().__init__()
        self.encoding = encoding
        self.set_size = set_size
        self.orders = tuple(orders)
        rates = torch.linspace(0, drop_path, depth).tolist() if depth > 1 else [drop_path] * depth
        self.blocks = nn.ModuleList(
            EncoderBlock(dim, num_heads, encoding, i, mlp_ratio, rates[i]) for i in range(depth)
        )

    def forward(self, feat: Tensor, coords: Tensor, cells: Tensor, group: Tensor) -> Tensor:
        """feat (N, D), positions ``coords`` (N, P), integer ``cells`` (N, 3) >= 0 and ``group``
        (N,) in 0..G-1 -> (N, D)."""
        if not self.blocks or not len(feat):
            return feat
        coords, feat = self._prepare(feat, coords, group)
        perms = serialize(cells, group, self.orders)
        for i, block in enumerate(self.blocks):
            sets = make_patches(perms[i % len(perms)], group, self.set_size)
            layout = PositionLayout(coords=sets.gather(coords), has_pos=sets.valid, valid=sets.valid)
            feat = sets.scatter(block(sets.gather(feat), layout))
        return feat

    def _prepare(self, feat: Tensor, coords: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
        """The encoding's once-per-input hooks (``prepare``, ``embed``) on each group's tokens."""
        p = coords.shape[-1]
        padded, valid, slot = padded_per_sample(torch.cat([coords.to(feat.dtype), feat], dim=-1), group)
        # Padded together with the features, the positions would come out of the concatenation
        # requiring grad: a bias built from them would then require grad too, which sends CPU
        # SDPA to its math kernel and backpropagates through every distance (ALiBi's tiny
        # training step: 1.2 s). Positions are data, not a function of the weights: detach them.
        positions = padded[..., :p].detach()
        layout = self.encoding.prepare(PositionLayout(coords=positions, has_pos=valid, valid=valid))
        x = self.encoding.embed(padded[..., p:], layout)
        flat = lambda t: t.reshape(-1, t.shape[-1])[slot]  # noqa: E731
        return flat(layout.coords).to(coords.dtype), flat(x)


def camera_geometry(image_hw: tuple[int, int], patch_size: int) -> Geometry:
    """Positions of the camera intra-modal blocks: (row, column) on one view's patch grid."""
    return Geometry(pos_dim=2, grid_shape=(image_hw[0] // patch_size, image_hw[1] // patch_size), units="patch")


def scene_geometry(position_scale: float) -> Geometry:
    """Positions of the LiDAR and inter-modal blocks: irregular 3-D points (grid-only encodings are n/a)."""
    return Geometry(pos_dim=3, grid_shape=None, units=f"{1.0 / position_scale:g} m", num_prefix_tokens=0)


class UniTR(nn.Module):
    """The backbone: batch dict -> BEV map (B, dim, X, Y) of the LiDAR tokens after fusion."""

    #: voxel pooling, serialization and patching size tensors by the data: ``trainer.compile``
    #: compiles each transformer block, not the whole forward (``harness/compile.py``)
    compiles_per_block = True

    def __init__(
        self,
        make_encoding: EncodingFactory,
        cfg: UniTRConfig,
        grid: VoxelGrid,
        image_hw: tuple[int, int],
        point_channels: int,
        dim: int,
        num_heads: int,
        patch_size: int,
        mlp_ratio: float,
        drop_path: float,
    ) -> None:
        super().__init__()
        cfg.check()
        self.cfg, self.grid, self.image_hw, self.patch_size = cfg, grid, image_hw, patch_size
        self.position_scale = cfg.position_scale or 1.0 / grid.voxel_size[0]
        scene, camera = scene_geometry(self.position_scale), camera_geometry(image_hw, patch_size)

        def stack(geometry: Geometry, depth: int, set_size: int) -> SetAttentionStack:
            encoding = make_encoding(geometry, dim, num_heads, max(depth, 1))
            return SetAttentionStack(encoding, dim, num_heads, depth, set_size, cfg.orders, mlp_ratio, drop_path)

        self.voxel_encoder = DynamicVoxelEncoder(point_channels, dim)
        self.patch_embed = nn.Conv2d(3, dim, patch_size, stride=patch_size)
        self.patch_norm = nn.LayerNorm(dim)
        self.register_buffer("image_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("image_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.lifter = ImageLifter(patch_size, cfg.fallback_depth)
        self.lidar_blocks = stack(scene, cfg.intra_depth, cfg.lidar_set_size)
        self.camera_blocks = stack(camera, cfg.intra_depth, cfg.camera_set_size)
        self.modality = nn.Parameter(torch.randn(2, dim) * 0.02)  # 0: LiDAR, 1: camera
        self.inter_blocks = stack(scene, cfg.inter_depth, cfg.inter_set_size)
        self.norm = nn.LayerNorm(dim)
        self.out_channels = dim

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        points, point_batch = batch["points"], batch["point_batch"]
        images = batch["images"]  # (B, V, 3, H, W)
        b_size, views = images.shape[:2]

        # LiDAR tokens, intra-modal.
        voxels, features, inverse, _ = voxelise(points, point_batch, self.grid)
        lidar = self.voxel_encoder(features, inverse, len(voxels.batch))
        lidar_pos = voxels.centres * self.position_scale
        lidar = self.lidar_blocks(lidar, lidar_pos, voxels.cells, voxels.batch)

        # Camera tokens, intra-modal: one group per view, positions (row, column).
        x = self.patch_embed(((images - self.image_mean.unsqueeze(0)) / self.image_std.unsqueeze(0)).flatten(0, 1))
        rows, cols = x.shape[-2:]
        camera = self.patch_norm(x.flatten(2).transpose(1, 2)).reshape(-1, x.shape[1])  # (B*V*h*w, D)
        patch = PositionLayout.grid(1, (rows, cols), device=x.device).coords[0]  # (h*w, 2)
        cam_pos = patch.repeat(b_size * views, 1)
        cam_cells = torch.cat([cam_pos.long(), torch.zeros_like(cam_pos[:, :1]).long()], dim=-1)
        view_group = torch.arange(b_size * views, device=x.device).repeat_interleave(rows * cols)
        camera = self.camera_blocks(camera, cam_pos, cam_cells, view_group)

        # Inter-modal: LiDAR voxels and lifted image patches of a sample together.
        lifted = self.lifter(points, point_batch, batch["intrinsics"], batch["cam_to_ego"], self.image_hw)
        lifted = lifted.reshape(-1, 3)
        shape = torch.tensor(self.grid.shape, device=x.device)
        lifted_cells = torch.minimum(self.grid.cells(lifted).clamp_min(0), shape - 1)
        tokens = torch.cat([lidar + self.modality[0], camera + self.modality[1]])
        positions = torch.cat([lidar_pos, lifted * self.position_scale])
        cells = torch.cat([voxels.cells, lifted_cells])
        group = torch.cat([voxels.batch, view_group // views])
        fused = self.inter_blocks(tokens, positions, cells, group)[: len(lidar)]

        # Bird's-eye view: max over each voxel column.
        sx, sy, _ = self.grid.shape
        column = (voxels.batch * sx + voxels.cells[:, 0]) * sy + voxels.cells[:, 1]
        bev = segment_reduce(self.norm(fused), column, b_size * sx * sy, "amax")
        return bev.view(b_size, sx, sy, -1).permute(0, 3, 1, 2).contiguous()
