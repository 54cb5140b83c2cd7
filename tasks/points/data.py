"""Point-cloud samples -> augmented, grid-sampled, batched tensors (Pointcept's transform chain).

A sample is a dict of numpy arrays (coord, normal, optionally color and segment, or a
label). Training samples get the configured augmentations with a generator drawn from
torch's RNG (so ``seed_everything`` fixes them); evaluation samples are deterministic.
Batches are flat: ``coord`` (N, 3), ``grid_coord`` (N, 3), ``feat`` (N, C), ``batch`` (N,)
and ``label`` (B,) or ``segment`` (N,). Evaluation samples that score every point of the scene
(ScanNet, as Pointcept's evaluator) also carry ``inverse`` (M,), the kept point standing for
each of the scene's M points, and ``origin_segment`` (M,), their labels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from pe_bench.harness.config import ConfigError, Strict
from pe_bench.harness.data import BuiltSplitsDataModule


class Augment(Strict):
    """The augmentations of PTv3's official configs that pe-bench implements (see README)."""

    normalize_coord: bool = False  # ModelNet40: centre on the centroid, scale into the unit sphere
    center_z: bool = False  # ScanNet: floor (lowest point) at z = 0 before anything else
    rotate_z: float = 0.0  # random rotation about the vertical axis, angle in [-a, a] x pi
    rotate_z_p: float = 1.0
    tilt: float = 0.0  # random rotation about x and y, angle in [-a, a] x pi, each with p = 0.5
    scale: tuple[float, float] = (1.0, 1.0)
    anisotropic: bool = False
    shift: float = 0.0  # uniform shift in [-s, s] per axis
    flip: bool = False  # mirror x and y, each with p = 0.5
    jitter: float = 0.0  # Gaussian sigma, clipped at 4 sigma
    dropout: float = 0.0  # fraction of points dropped, in 20 % of the samples (ScanNet)
    color_jitter: float = 0.0  # Gaussian std on colours in [0, 1] units, p = 0.95
    sphere_crop: int = 0  # keep at most this many points nearest a random point (0: off)


def _rot(angle: float, axis: int) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    i, j = [a for a in range(3) if a != axis]
    r = np.eye(3, dtype=np.float32)
    r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    return r


def augment(sample: dict, aug: Augment, rng: np.random.Generator | None) -> dict:
    """Geometric and colour transforms; ``rng`` None = evaluation (only the normalisations)."""
    s = dict(sample)
    coord = s["coord"].astype(np.float32)
    if aug.normalize_coord:
        coord = coord - coord.mean(0)
        coord = coord / max(float(np.linalg.norm(coord, axis=1).max()), 1e-6)
    if aug.center_z:
        lo, hi = coord.min(0), coord.max(0)
        coord = coord - np.array([(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, lo[2]], dtype=np.float32)
    if rng is not None:
        if aug.dropout and rng.random() < 0.2:
            keep = rng.permutation(len(coord))[: int(len(coord) * (1 - aug.dropout))]
            s = {k: v[keep] if isinstance(v, np.ndarray) and len(v) == len(coord) else v for k, v in s.items()}
            coord = coord[keep]
        rot = np.eye(3, dtype=np.float32)
        if aug.rotate_z and rng.random() < aug.rotate_z_p:
            rot = _rot(rng.uniform(-aug.rotate_z, aug.rotate_z) * np.pi, 2) @ rot
        for axis in (0, 1):
            if aug.tilt and rng.random() < 0.5:
                rot = _rot(rng.uniform(-aug.tilt, aug.tilt) * np.pi, axis) @ rot
        coord = coord @ rot.T
        if "normal" in s:
            s["normal"] = s["normal"] @ rot.T
        factor = rng.uniform(*aug.scale, size=3 if aug.anisotropic else 1).astype(np.float32)
        coord = coord * factor
        if aug.shift:
            coord = coord + rng.uniform(-aug.shift, aug.shift, 3).astype(np.float32)
        if aug.flip:
            for axis in (0, 1):
                if rng.random() < 0.5:
                    coord[:, axis] = -coord[:, axis]
                    if "normal" in s:
                        s["normal"] = s["normal"].copy()
                        s["normal"][:, axis] = -s["normal"][:, axis]
        if aug.jitter:
            coord = coord + np.clip(rng.normal(0, aug.jitter, coord.shape), -4 * aug.jitter, 4 * aug.jitter)
        if aug.color_jitter and "color" in s and rng.random() < 0.95:
            s["color"] = np.clip(s["color"] + rng.normal(0, aug.color_jitter * 255, s["color"].shape), 0, 255)
    s["coord"] = coord.astype(np.float32)
    return s


def grid_sample(sample: dict, grid_size: float, rng: np.random.Generator | None, return_inverse: bool = False) -> dict:
    """One point per voxel of side ``grid_size`` (random in training, the first otherwise), with
    integer ``grid_coord`` from 0 (Pointcept's GridSample in "train" mode). ``return_inverse``
    adds ``inverse``: for every point of ``sample``, the index of the kept point of its voxel."""
    coord = sample["coord"]
    voxel = np.floor(coord / grid_size).astype(np.int64)
    voxel -= voxel.min(0)
    order = rng.permutation(len(coord)) if rng is not None else np.arange(len(coord))
    found = np.unique(voxel[order], axis=0, return_index=True, return_inverse=return_inverse)
    first = found[1]
    keep = np.sort(order[first])
    n = len(coord)
    out = {k: v[keep] if isinstance(v, np.ndarray) and len(v) == n else v for k, v in sample.items()}
    out["grid_coord"] = voxel[keep]
    if return_inverse:
        out["inverse"] = _kept_point_of_each_point(order, first, found[2].reshape(-1))
    return out


def _kept_point_of_each_point(order: np.ndarray, first: np.ndarray, voxel_of: np.ndarray) -> np.ndarray:
    """``inverse`` of :func:`grid_sample`: voxel u's kept point is ``order[first[u]]``, at position
    ``rank[u]`` of the sorted kept points; ``voxel_of[m]`` is the voxel of point ``order[m]``."""
    representative = order[first]
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(representative)] = np.arange(len(first))
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = rank[voxel_of]
    return inverse


def sphere_crop(sample: dict, point_max: int, rng: np.random.Generator | None) -> dict:
    n = len(sample["coord"])
    if not point_max or n <= point_max:
        return sample
    centre = sample["coord"][rng.integers(n) if rng is not None else n // 2]
    keep = np.sort(np.argsort(((sample["coord"] - centre) ** 2).sum(1))[:point_max])
    return {k: v[keep] if isinstance(v, np.ndarray) and len(v) == n else v for k, v in sample.items()}


FeatureKey = Literal["coord", "normal", "color"]


class PointDataset(Dataset):
    """Samples from ``load(i)`` through augment -> grid sample -> crop -> features.

    ``score_every_point`` (evaluation only): the sample also carries every point's labels
    (``origin_segment``) and the kept point standing for each (``inverse``), so that every point
    of the scene is scored, not one per voxel; Pointcept's evaluator maps its predictions back
    the same way. It needs the whole scene: no sphere crop."""

    def __init__(
        self,
        load: Callable[[int], dict],
        size: int,
        aug: Augment,
        grid_size: float,
        feat_keys: Sequence[FeatureKey],
        train: bool,
        score_every_point: bool = False,
    ) -> None:
        if score_every_point and (train or aug.sphere_crop):
            raise ConfigError(
                "every point of a scene is scored (Pointcept's evaluation), which needs whole scenes: "
                "no sphere_crop in data.eval_aug, and never in training"
            )
        self.load, self.size, self.aug = load, size, aug
        self.grid_size, self.feat_keys, self.train = grid_size, tuple(feat_keys), train
        self.score_every_point = score_every_point

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng(int(torch.randint(2**31, ()))) if self.train else None
        s = augment(self.load(i), self.aug, rng)
        every_point = {"origin_segment": torch.from_numpy(s["segment"]).long()} if self.score_every_point else {}
        s = grid_sample(s, self.grid_size, rng, return_inverse=self.score_every_point)
        if self.aug.sphere_crop:
            s = sphere_crop(s, self.aug.sphere_crop, rng)
            s["grid_coord"] = s["grid_coord"] - s["grid_coord"].min(0)
        if self.aug.center_z:  # Pointcept re-centres x, y (not z) after cropping
            lo, hi = s["coord"].min(0), s["coord"].max(0)
            s["coord"] = s["coord"] - np.array([(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, 0], dtype=np.float32)
        parts = []
        for key in self.feat_keys:
            value = s[key]
            parts.append(value / 127.5 - 1.0 if key == "color" else value)  # NormalizeColor
        out = {
            "coord": torch.from_numpy(s["coord"]).float(),
            "grid_coord": torch.from_numpy(s["grid_coord"]).long(),
            "feat": torch.from_numpy(np.concatenate(parts, axis=1)).float(),
        }
        if "segment" in s:
            out["segment"] = torch.from_numpy(s["segment"]).long()
        if "label" in s:
            out["label"] = torch.tensor(int(s["label"]))
        if every_point:
            out |= every_point | {"inverse": torch.from_numpy(s["inverse"])}
        return out


def collate(samples: list[dict]) -> dict:
    """Flat concatenation with a per-point batch index."""
    out = {k: torch.cat([s[k] for s in samples]) for k in ("coord", "grid_coord", "feat")}
    out["batch"] = torch.cat([torch.full((len(s["coord"]),), i, dtype=torch.long) for i, s in enumerate(samples)])
    if "segment" in samples[0]:
        out["segment"] = torch.cat([s["segment"] for s in samples])
    if "label" in samples[0]:
        out["label"] = torch.stack([s["label"] for s in samples])
    if "inverse" in samples[0]:
        # Each sample's inverse indexes its own kept points: shift it past the samples before it.
        starts = np.cumsum([0] + [len(s["coord"]) for s in samples[:-1]])
        out["inverse"] = torch.cat([s["inverse"] + int(start) for s, start in zip(samples, starts, strict=True)])
        out["origin_segment"] = torch.cat([s["origin_segment"] for s in samples])
    return out


class PointDataModule(BuiltSplitsDataModule):
    collate_fn = staticmethod(collate)
