"""data.held_out_pairs: test images whose (anchor, target) placement training never showed.

Without it 95-98 % of the tiny image tasks' test images repeat a training image's placement
(an audit at stop 66), so a lookup of placements scores as well as the relation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.harness.config import ConfigError, load_run_config, parse_overrides
from pe_bench.tasks.base import get_task
from pe_bench.tasks.image.synthetic import (
    FreshRelationImages,
    _templates,
    pair_label,
    relation_images,
    relation_images_with_pairs,
    split_pairs,
)


@settings(max_examples=25, deadline=None)
@given(side=st.integers(4, 8), num_classes=st.sampled_from([4, 8, 10, 12]), held_out=st.floats(0.05, 0.9))
def test_the_split_partitions_every_class_placements(side: int, num_classes: int, held_out: float) -> None:
    seen, unseen = split_pairs((side, side), num_classes, held_out)
    labelled = {
        (a, b)
        for a in range(side * side)
        for b in range(side * side)
        if a != b and pair_label(a, b, side, num_classes) is not None
    }
    assert seen | unseen == labelled and not seen & unseen
    for label in range(num_classes):
        ours = [p for p in labelled if pair_label(*p, side, num_classes) == label]
        held = sum(p in unseen for p in ours)
        assert 1 <= held <= len(ours) - 1, f"class {label}: {held} of {len(ours)} held out"
        assert abs(held - held_out * len(ours)) <= 1
    assert split_pairs((side, side), num_classes, held_out) == (seen, unseen), "fixed by its seed"


def test_a_grid_too_small_to_hold_out_a_placement_per_class_is_an_error() -> None:
    with pytest.raises(ValueError, match="larger data.image_size or fewer data.num_classes"):
        split_pairs((2, 2), 12, 0.25)


def test_restricted_images_show_their_placements_and_unrestricted_ones_are_unchanged() -> None:
    _, unseen = split_pairs((6, 6), 8, 0.25)
    images, labels, placements = relation_images_with_pairs(64, 8, (6, 6), 4, 1, 0, 0.0, seed=3, pairs=unseen)
    templates = _templates(4, 1, np.random.default_rng(1234))
    for image, label, (a, b) in zip(images, labels, placements, strict=True):
        assert (a, b) in unseen and int(label) == pair_label(a, b, 6, 8)
        for cell, kind in ((a, 0), (b, 1)):  # noise 0: the anchor and target templates lie where claimed
            y, x = divmod(cell, 6)
            assert torch.equal(image[:, y * 4 : y * 4 + 4, x * 4 : x * 4 + 4], torch.from_numpy(templates[kind]))
    plain = relation_images(40, 8, (6, 6), 4, 3, 1, 0.15, seed=1000)
    traced = relation_images_with_pairs(40, 8, (6, 6), 4, 3, 1, 0.15, seed=1000)
    assert torch.equal(plain[0], traced[0]) and torch.equal(plain[1], traced[1])


def _splits(*overrides: str, train_size: int = 600):
    config = load_run_config("imagenet", "tiny", parse_overrides([f"data.train_size={train_size}", *overrides]))
    datamodule = get_task("imagenet")(config).datamodule(seed=0)
    datamodule.setup("fit")
    return datamodule


def test_no_test_placement_is_in_training_and_the_record_says_so() -> None:
    datamodule = _splits("data.held_out_pairs=0.25")
    seen, unseen = split_pairs((6, 6), 8, 0.25)
    grid = dict(num_classes=8, grid=(6, 6), patch=4, channels=3, distractors=1, noise=0.15)
    for split, seed, allowed in (("train", 1000, seen), ("val", 1001, seen), ("test", 1002, unseen)):
        count = len(datamodule.splits[split])
        images, labels, placements = relation_images_with_pairs(count, **grid, seed=seed, pairs=allowed)
        assert torch.equal(datamodule.splits[split].tensors[0], images), split
        assert set(placements) <= allowed
    assert datamodule.extra_results() == {"test_placements_seen_in_training": 0.0}
    # without it, the tiny profile's test split repeats training's placements (the README's figure)
    usual = _splits(train_size=3000)
    assert usual.test_placements_seen == pytest.approx(0.984)
    assert "test_placements_seen_in_training" not in usual.extra_results()


def test_fresh_training_images_keep_to_the_seen_placements() -> None:
    datamodule = _splits("data.held_out_pairs=0.5", "data.fresh_train_images=true")
    train = datamodule.splits["train"]
    assert isinstance(train, FreshRelationImages)
    seen, _ = split_pairs((6, 6), 8, 0.5)
    for i in (0, 7, 599, 10_000):
        _, _, placement = relation_images_with_pairs(1, *train.args, seed=[train.SEED, i], pairs=train.pairs)
        assert placement[0] in seen
        assert torch.equal(train[i][0], relation_images(1, *train.args, seed=[train.SEED, i], pairs=seen)[0][0])
    assert datamodule.extra_results() == {"test_placements_seen_in_training": 0.0}


def test_held_out_pairs_need_the_synthetic_source() -> None:
    config = load_run_config("cifar10", "paper", parse_overrides(["data.held_out_pairs=0.25"]))
    with pytest.raises(ConfigError, match="held_out_pairs.*synthetic"):
        get_task("cifar10")(config)


def test_extrapolation_test_sets_keep_out_the_placements_training_showed() -> None:
    """pe-bench extrapolate regenerates the test split on other patch grids: with held-out pairs
    it still shows none of the placements training did (a cell is the same position when its
    row and column are), and on the training grid itself exactly the held-out ones."""
    from pe_bench.tasks.image.synthetic import placements_not_seen

    seen, unseen = split_pairs((6, 6), 8, 0.25)
    assert placements_not_seen((6, 6), (6, 6), seen, 8) == unseen
    datamodule = _splits("data.held_out_pairs=0.25", train_size=64)
    for side in (16, 48):
        grid = (side // 4,) * 2
        allowed = placements_not_seen(grid, (6, 6), seen, 8)
        images, labels, placements = relation_images_with_pairs(
            datamodule.data.test_size, 8, grid, 4, 3, 1, 0.15, seed=5000 + 97 * side + side, pairs=allowed
        )
        test = datamodule.test_set_at(side, side)
        assert torch.equal(test.tensors[0], images) and torch.equal(test.tensors[1], labels)
        for a, b in placements:
            (ay, ax), (by, bx) = divmod(a, grid[1]), divmod(b, grid[1])
            in_training_grid = max(ay, ax, by, bx) < 6
            assert not (in_training_grid and (ay * 6 + ax, by * 6 + bx) in seen), (side, a, b)
    # without the option the extrapolation images are those of every stored extrapolation
    plain = _splits(train_size=64).test_set_at(48, 48)
    expected = relation_images(datamodule.data.test_size, 8, (12, 12), 4, 3, 1, 0.15, seed=5000 + 97 * 48 + 48)
    assert torch.equal(plain.tensors[0], expected[0])
