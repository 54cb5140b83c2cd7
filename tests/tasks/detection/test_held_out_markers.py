"""data.held_out_marker_cells (coco tiny): test scenes whose marker sits in cells training never showed.

Without it 98.5 % of the tiny coco's test objects repeat a training object's (marker cell,
centre cell) placement (the README's audit), so a lookup of placements scores as the relation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.harness.config import ConfigError, load_run_config, parse_overrides
from pe_bench.tasks._shared.data_checks import share_seen
from pe_bench.tasks.base import get_task
from pe_bench.tasks.detection.synthetic import (
    HELD_OUT_FILE,
    SceneSpec,
    object_placements,
    split_marker_cells,
    split_scenes,
    tiny_coco,
)
from pe_bench.tasks.detection.task import held_out

TINY = SceneSpec(48, (2, 4), (8, 14), 8)


@settings(max_examples=25, deadline=None)
@given(cells=st.integers(3, 12), fraction=st.floats(0.01, 0.99))
def test_the_split_partitions_the_marker_cells(cells: int, fraction: float) -> None:
    seen, unseen = split_marker_cells(cells, fraction)
    assert seen | unseen == set(range(cells * cells)) and not seen & unseen
    assert seen and unseen and abs(len(unseen) - fraction * cells * cells) <= 1
    assert split_marker_cells(cells, fraction) == (seen, unseen), "fixed by its seed"


def test_restricted_scenes_put_the_marker_in_their_cells() -> None:
    seen, unseen = split_marker_cells(6, 0.25)
    for scene in split_scenes("val2017", 40, TINY, unseen):
        row, col = scene.marker
        assert row * 6 + col in unseen
        for marker, _centre in object_placements(scene, 8):
            assert marker == row * 6 + col
    plain, free = next(split_scenes("train2017", 1, TINY)), next(split_scenes("train2017", 1, TINY, None))
    assert (plain.image == free.image).all() and plain.boxes == free.boxes


def test_without_the_option_test_objects_repeat_training_placements() -> None:
    """The README's audit row for coco: 823 distinct placements among the training objects (the
    train2017 images less validation's tenth), 98.5 % of the test objects' among them."""
    scenes = list(split_scenes("train2017", 1800, TINY))
    train_idx, _ = held_out(1800, 0.1)
    train = [p for i in train_idx for p in object_placements(scenes[i], 8)]
    test = [p for scene in split_scenes("val2017", 400, TINY) for p in object_placements(scene, 8)]
    assert len(set(train)) == 823
    assert share_seen(train, test) == pytest.approx(0.985, abs=5e-4)


def test_a_held_out_dataset_measures_its_overlap(tmp_path) -> None:
    root = tiny_coco(60, 20, TINY, cache=tmp_path, held_out=0.25)
    assert json.loads((root / HELD_OUT_FILE).read_text()) == {
        "held_out_marker_cells": 0.25,
        "test_objects_seen_in_training": 0.0,
    }
    assert root != tiny_coco(60, 20, TINY, cache=tmp_path), "a held-out dataset has a cache folder of its own"
    assert not (tiny_coco(60, 20, TINY, cache=tmp_path) / HELD_OUT_FILE).exists()


def test_held_out_marker_cells_need_generated_scenes() -> None:
    config = load_run_config("coco", "paper", parse_overrides(["data.held_out_marker_cells=0.25"]))
    with pytest.raises(ConfigError, match="coco/paper: data.held_out_marker_cells.*generated"):
        get_task("coco")(config)
