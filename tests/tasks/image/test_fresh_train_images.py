"""data.fresh_train_images: new relation images every training epoch, the same for every cell."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from pe_bench.harness.cli import main
from pe_bench.harness.config import ConfigError, load_run_config, parse_overrides
from pe_bench.harness.grid import store
from pe_bench.tasks.base import get_task
from pe_bench.tasks.image.synthetic import EpochBlocks, FreshRelationImages, relation_images

ARGS = (8, (6, 6), 4, 3, 1, 0.15)  # num_classes, grid, patch, channels, distractors, noise


def _epoch(sampler: EpochBlocks, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_each_epoch_reads_its_own_block_of_new_images_in_a_seeded_order():
    sampler = EpochBlocks(16, seed=3)
    first, second = _epoch(sampler, 0), _epoch(sampler, 1)
    assert sorted(first) == list(range(16)) and sorted(second) == list(range(16, 32))
    assert _epoch(sampler, 1) == second, "an epoch's order is repeatable"
    assert first != sorted(first), "shuffled"
    assert _epoch(EpochBlocks(16, seed=4), 0) != first, "the order follows the cell's seed"
    assert len(sampler) == 16


def test_image_i_is_fixed_by_its_index_and_differs_from_its_neighbours():
    images = FreshRelationImages(16, *ARGS)
    x5, y5 = images[5]
    again, label = images[5]
    assert torch.equal(x5, again) and int(y5) == int(label)
    assert x5.shape == (3, 24, 24) and 0 <= int(y5) < 8
    assert not torch.equal(x5, images[6][0]) and not torch.equal(x5, images[21][0])
    expected = relation_images(1, *ARGS, seed=[FreshRelationImages.SEED, 5])
    assert torch.equal(x5, expected[0][0]) and int(y5) == int(expected[1][0])


def test_fresh_images_need_the_synthetic_source():
    config = load_run_config("cifar10", "paper", parse_overrides(["data.fresh_train_images=true"]))
    assert config.data["source"] == "cifar10"
    with pytest.raises(ConfigError, match="fresh_train_images.*synthetic"):
        get_task("cifar10")(config)


def test_a_cell_trains_on_new_images_every_epoch(tmp_path, monkeypatch):
    """End to end: Lightning moves the sampler to the next block each epoch, so two epochs read
    2 x train_size different images."""
    seen: list[int] = []
    getitem = FreshRelationImages.__getitem__

    def recording(self, i):
        seen.append(int(i))
        return getitem(self, i)

    monkeypatch.setattr(FreshRelationImages, "__getitem__", recording)
    small = ["optim.epochs=2", "data.train_size=64", "data.val_size=16", "data.test_size=16", "model.dim=32",
             "model.depth=1", "optim.batch_size=16", "data.fresh_train_images=true"]  # fmt: skip
    argv = ["run", "--tasks", "imagenet", "--methods", "sincos", "--out", str(tmp_path), "--no-progress"]
    assert main(argv + [arg for override in small for arg in ("--set", override)]) == 0
    assert sorted(seen) == list(range(128))
    record = json.loads((store.cell_dir(tmp_path, "imagenet", "sincos", 0) / "result.json").read_text())
    assert record["status"] == "ok"


def test_fresh_images_refuse_ddp_where_the_epoch_would_not_reach_the_sampler():
    config = load_run_config(
        "imagenet", "tiny", parse_overrides(["data.fresh_train_images=true", "data.train_size=32"])
    )
    datamodule = get_task("imagenet")(config).datamodule(seed=0)
    datamodule.setup("fit")
    assert isinstance(datamodule.train_dataloader().sampler, EpochBlocks)
    datamodule.trainer = SimpleNamespace(world_size=2)
    with pytest.raises(ConfigError, match="one process"):
        datamodule.train_dataloader()
