"""Samples -> batches for the detector, and the data module over the three splits.

A sample is a dict of tensors: ``points`` (M, C >= 3: x, y, z, intensity, ...) in the ego
frame, ``images`` (V, 3, H, W) in [0, 1], ``intrinsics`` (V, 3, 3), ``cam_to_ego`` (V, 4, 4),
``boxes`` (K, 7: x, y, z, l, w, h, yaw) and ``labels`` (K,); real nuScenes samples also carry
``ego_frame`` (4, 4), for the evaluation's class ranges, and ``bike_racks`` (R, 4, 4), for its
bike-rack filter (:mod:`.metric`; the generated scenes have no racks and carry neither). A
batch concatenates the points with a ``point_batch`` index, stacks the images and calibration
(and ``ego_frame``), and keeps boxes and labels (and ``bike_racks``) as per-sample lists.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.data import Dataset

from pe_bench.harness.data import BuiltSplitsDataModule


def collate(samples: list[dict[str, Tensor]]) -> dict:
    stacked = ("images", "intrinsics", "cam_to_ego", *(["ego_frame"] if "ego_frame" in samples[0] else []))
    listed = ("boxes", "labels", *(["bike_racks"] if "bike_racks" in samples[0] else []))  # sizes vary per sample
    return {
        "points": torch.cat([s["points"] for s in samples]),
        "point_batch": torch.cat([torch.full((len(s["points"]),), i, dtype=torch.long) for i, s in enumerate(samples)]),
        **{k: torch.stack([s[k] for s in samples]) for k in stacked},
        **{k: [s[k] for s in samples] for k in listed},
    }


class SampleList(Dataset):
    """Samples from ``load(i)``, i < ``size`` (a list's ``__getitem__`` or a file reader)."""

    def __init__(self, load: Callable[[int], dict[str, Tensor]], size: int) -> None:
        self.load, self.size = load, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return self.load(i)


class SceneDataModule(BuiltSplitsDataModule):
    collate_fn = staticmethod(collate)
