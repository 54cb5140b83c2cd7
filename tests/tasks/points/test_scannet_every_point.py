"""ScanNet's mIoU over every point of a scene (Pointcept's evaluator maps the voxel-sampled
predictions back through the inverse index), not over one point per 2 cm voxel; the generated
tiny rooms keep scoring their sampled points."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_miou import _reference
from test_task_points_data import write_scannet
from torch import nn

from pe_bench.harness.config import ConfigError, load_run_config
from pe_bench.tasks import get_task
from pe_bench.tasks.points.data import Augment, PointDataset, collate, grid_sample
from pe_bench.tasks.points.module import PointSegmentationModule

GRID = 0.02


def scene(n: int, seed: int, flip: bool = False) -> dict:
    """Points in a 1 m cube, half of them packed into a 20 cm corner (a dense object); the label
    is 1 where x >= 0.5 (0 with ``flip``), constant within every 2 cm voxel."""
    rng = np.random.default_rng(seed)
    coord = rng.uniform(0, 1.0, (n, 3)).astype(np.float32)
    coord[: n // 2] *= 0.2
    segment = (coord[:, 0] >= 0.5).astype(np.int64) ^ int(flip)
    zeros = np.zeros_like(coord)
    return {"coord": coord, "normal": zeros, "color": zeros, "segment": segment}


def evaluation_set(scenes: list[dict], every_point: bool) -> PointDataset:
    return PointDataset(scenes.__getitem__, len(scenes), Augment(), GRID, ("color", "normal"), False, every_point)


class KeptLabel(nn.Module):
    """Predicts each kept point's own label: right wherever the voxels are pure."""

    def forward(self, batch: dict) -> torch.Tensor:
        return nn.functional.one_hot(batch["segment"], 2).float()


class AlwaysOne(nn.Module):
    def forward(self, batch: dict) -> torch.Tensor:
        return torch.tensor([0.0, 1.0]).expand(len(batch["segment"]), 2)


def validation_miou(model: nn.Module, batch: dict) -> float:
    module = PointSegmentationModule(model, 2, load_run_config("scannet", "tiny", {}).optim)
    with pytest.warns(UserWarning, match="self.log"):  # no trainer here; the metric still updates
        module.validation_step(batch, 0)
    return float(module.val_miou.compute())


@pytest.mark.parametrize("seed", [None, 7])  # evaluation (the first point per voxel) and training (a random one)
def test_the_inverse_maps_every_point_to_the_kept_point_of_its_voxel(seed):
    sample = scene(5000, 0) | {"index": np.arange(5000)}
    rng = None if seed is None else np.random.default_rng(seed)
    out = grid_sample(sample, GRID, rng, return_inverse=True)
    voxel = np.floor(sample["coord"] / GRID).astype(np.int64)
    assert len(out["inverse"]) == 5000 and len(out["index"]) < 4000  # the dense corner shares voxels
    np.testing.assert_array_equal(voxel[out["index"][out["inverse"]]], voxel)
    np.testing.assert_array_equal(out["inverse"][out["index"]], np.arange(len(out["index"])))  # kept -> itself


def test_without_the_inverse_grid_sampling_is_what_it_was():
    sample = scene(5000, 0)
    plain, with_inverse = grid_sample(sample, GRID, None), grid_sample(sample, GRID, None, return_inverse=True)
    assert set(with_inverse) - set(plain) == {"inverse"}
    for key, value in plain.items():
        np.testing.assert_array_equal(value, with_inverse[key])


def test_a_batch_scores_every_point_of_each_of_its_scenes():
    scenes = [scene(3000, 1), scene(2000, 2, flip=True)]
    batch = collate([evaluation_set(scenes, True)[i] for i in range(2)])
    assert len(batch["origin_segment"]) == len(batch["inverse"]) == 5000
    # Pure voxels: the kept labels, taken back through the batch's inverse, are every point's label.
    torch.testing.assert_close(batch["segment"][batch["inverse"]], batch["origin_segment"])
    assert validation_miou(KeptLabel(), batch) == pytest.approx(1.0)


def test_dense_objects_weigh_by_their_points_not_their_voxels():
    scenes = [scene(20000, 0)]
    every_point = collate([evaluation_set(scenes, True)[0]])
    per_voxel = collate([evaluation_set(scenes, False)[0]])
    everything = torch.ones(20000, dtype=torch.long)
    expected = _reference(everything, torch.from_numpy(scenes[0]["segment"]), 2)
    assert validation_miou(AlwaysOne(), every_point) == pytest.approx(expected)
    kept = per_voxel["segment"]
    assert validation_miou(AlwaysOne(), per_voxel) == pytest.approx(_reference(torch.ones_like(kept), kept, 2))
    assert abs(expected - _reference(torch.ones_like(kept), kept, 2)) > 0.05


def test_the_paper_profile_scores_every_scannet_point_and_the_tiny_rooms_do_not(tmp_path):
    write_scannet(tmp_path / "scannet", scenes=1, points=300)
    splits = get_task("scannet")(load_run_config("scannet", "paper"), tmp_path)._splits()
    assert [splits[s].score_every_point for s in ("train", "val", "test")] == [False, True, True]
    item = splits["val"][0]
    assert len(item["inverse"]) == len(item["origin_segment"]) == 300 and len(item["segment"]) <= 300
    tiny = get_task("scannet")(load_run_config("scannet", "tiny"))._splits()
    assert not any(tiny[s].score_every_point for s in ("train", "val", "test"))
    assert set(tiny["val"][0]) == {"coord", "grid_coord", "feat", "segment"}


def test_every_point_needs_whole_scenes():
    with pytest.raises(ConfigError, match="no sphere_crop in data.eval_aug"):
        PointDataset(lambda i: {}, 1, Augment(sphere_crop=100), GRID, ("color",), False, score_every_point=True)
