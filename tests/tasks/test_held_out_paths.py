"""data.held_out_paths (ucf101, dvsgesture): test samples whose motion path training never showed.

Without it every tiny test clip and stream repeats a training sample's path (the README's
audit: 30 of 30 paths on ucf101's 3x3 grid, 373 of 384 on dvsgesture's 6x6 grid), so a lookup
of paths scores as well as the motion."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.harness.config import ConfigError, load_run_config, parse_overrides
from pe_bench.tasks._shared.motion import MOTIONS, class_paths, motion_path, sample_motion, split_paths
from pe_bench.tasks.base import get_task
from pe_bench.tasks.events.emulator import motion_event_streams
from pe_bench.tasks.video.synthetic import _shapes, motion_clips, motion_clips_with_paths


@settings(max_examples=12, deadline=None)
@given(grid=st.integers(3, 6), label=st.integers(0, len(MOTIONS) - 1))
def test_the_enumerated_paths_are_what_the_sampler_draws(grid: int, label: int) -> None:
    """class_paths enumerates sample_motion's choices: 2,000 draws give exactly its paths."""
    rng = np.random.default_rng(grid * 10 + label)
    drawn = {motion_path(sample_motion(label, grid, 3, rng), 3) for _ in range(2000)}
    assert drawn == set(class_paths(label, grid, 3))


def test_path_counts_of_the_tiny_grids() -> None:
    """The README's audit: 30 paths on ucf101's 3x3 grid (diagonals have one each, so nothing
    can be held out there), 384 on dvsgesture's 6x6 grid."""
    assert [len(class_paths(label, 3, 3)) for label in range(8)] == [3, 3, 3, 3, 1, 1, 8, 8]
    assert [len(class_paths(label, 6, 3)) for label in range(8)] == [24, 24, 24, 24, 16, 16, 128, 128]


@settings(max_examples=20, deadline=None)
@given(grid=st.integers(4, 7), num_classes=st.integers(2, 8), held_out=st.floats(0.05, 0.9))
def test_the_split_partitions_every_class_paths(grid: int, num_classes: int, held_out: float) -> None:
    seen, unseen = split_paths(num_classes, grid, 3, held_out)
    assert not seen & unseen
    for label in range(num_classes):
        ours = set(class_paths(label, grid, 3))
        held = len(ours & unseen)
        assert ours <= seen | unseen
        assert 1 <= held <= len(ours) - 1, f"{MOTIONS[label]}: {held} of {len(ours)} held out"
        assert abs(held - held_out * len(ours)) <= 1
    assert split_paths(num_classes, grid, 3, held_out) == (seen, unseen), "fixed by its seed"


def test_a_grid_with_one_path_in_a_class_cannot_hold_out() -> None:
    with pytest.raises(ValueError, match="down-right has 1 path on a 3x3 grid.*larger grid"):
        split_paths(8, 3, 3, 0.25)


def test_paths_of_another_grid_are_an_error_not_an_endless_draw() -> None:
    _, unseen = split_paths(8, 6, 3, 0.25)
    with pytest.raises(ValueError, match="another grid"):
        elsewhere = frozenset(path for path in unseen if path[0][1] > 3)  # "right" starts in columns 0-1 on 4x4
        sample_motion(MOTIONS.index("right"), 4, 3, np.random.default_rng(0), elsewhere)


def test_restricted_clips_show_their_paths_and_unrestricted_ones_are_unchanged() -> None:
    _, unseen = split_paths(8, 5, 3, 0.25)
    clips, labels, paths = motion_clips_with_paths(48, 8, 5, 4, 3, 2, 1, 0.0, seed=3, paths=unseen)
    disk, _ = _shapes(4)
    for clip, label, path in zip(clips, labels, paths, strict=True):
        assert path in unseen and path in class_paths(int(label), 5, 3)
        for k, (r, c) in enumerate(path):  # noise 0: the disk lies in the path's cell at step k
            cell = clip[0, 2 * k, r * 4 : r * 4 + 4, c * 4 : c * 4 + 4]
            assert torch.all(cell[torch.from_numpy(disk) > 0] > 0)
    plain = motion_clips(40, 8, 3, 4, 3, 2, 3, 0.1, seed=2000)
    traced = motion_clips_with_paths(40, 8, 3, 4, 3, 2, 3, 0.1, seed=2000)
    assert torch.equal(plain[0], traced[0]) and torch.equal(plain[1], traced[1])


def test_restricted_streams_flash_along_their_paths() -> None:
    _, unseen = split_paths(8, 6, 3, 0.25)
    streams, labels, paths = motion_event_streams(24, 8, frames=24, distractors=0, seed=5, paths=unseen)
    for (x, y, _t, _p), label, path in zip(streams, labels, paths, strict=True):
        assert path in unseen and path in class_paths(int(label), 6, 3)
        fired = set(zip((y // 8).tolist(), (x // 8).tolist(), strict=True))
        assert fired == set(path)  # no distractor: only the path's cells fire


def _datamodule(task: str, *overrides: str):
    config = load_run_config(task, "tiny", parse_overrides(list(overrides)))
    datamodule = get_task(task)(config).datamodule(seed=0)
    datamodule.setup("fit")
    return datamodule


def test_ucf101_tests_only_held_out_paths_and_the_record_says_so() -> None:
    size = ["data.image_height=20", "data.image_width=20"]  # a 5x5 grid: 2 or more paths per class
    size += ["data.train_size=320", "data.val_size=40", "data.test_size=80"]
    datamodule = _datamodule("ucf101", *size, "data.held_out_paths=0.25")
    seen, unseen = split_paths(8, 5, 3, 0.25)
    for split, seed, allowed in (("train", 2000, seen), ("val", 2001, seen), ("test", 2002, unseen)):
        count = len(datamodule.splits[split])
        clips, labels, paths = motion_clips_with_paths(count, 8, 5, 4, 3, 2, 3, 0.1, seed, allowed)
        assert torch.equal(datamodule.splits[split].clips, clips), split
        assert set(paths) <= allowed
    assert datamodule.extra_results() == {"test_paths_seen_in_training": 0.0}
    # the tiny profile as it is: every test clip's path is a training clip's (the README's figure)
    usual = _datamodule("ucf101")
    assert usual.test_paths_seen == 1.0 and usual.extra_results() == {}
    _, _, train_paths = motion_clips_with_paths(2400, 8, 3, 4, 3, 2, 3, 0.1, 2000)
    assert len(set(train_paths)) == 30  # every path of the 3x3 grid is in training


def test_dvsgesture_tests_only_held_out_paths_and_the_record_says_so() -> None:
    sizes = ["data.train_size=200", "data.val_size=20", "data.test_size=40"]
    datamodule = _datamodule("dvsgesture", *sizes, "data.held_out_paths=0.25")
    assert datamodule.extra_results() == {"test_paths_seen_in_training": 0.0}
    seen, unseen = split_paths(8, 6, 3, 0.25)
    _, labels, test_paths = motion_event_streams(40, 8, grid=6, cell=8, threshold=0.25, seed=3002, paths=unseen)
    assert set(test_paths) <= unseen and datamodule.splits["test"].labels == labels.tolist()
    # the tiny profile's 3,000 training streams show 373 of the 384 paths, every test one among them
    _, _, train_paths = motion_event_streams(3000, 8, grid=6, cell=8, threshold=0.25, seed=3000)
    assert len(set(train_paths)) == 373
    assert _datamodule("dvsgesture").test_paths_seen == 1.0


@pytest.mark.parametrize(
    ("task", "profile", "overrides", "message"),
    [
        ("ucf101", "tiny", [], "down-right has 1 path on a 3x3 grid"),
        ("ucf101", "paper", [], "needs generated data"),
        ("dvsgesture", "paper", [], "needs generated data"),
        ("dvsgesture", "tiny", ["data.width=16", "data.height=16"], "right has 0 paths"),
    ],
)
def test_held_out_paths_that_cannot_work_are_config_errors(task, profile, overrides, message) -> None:
    config = load_run_config(task, profile, parse_overrides([*overrides, "data.held_out_paths=0.25"]))
    with pytest.raises(ConfigError, match=f"{task}/{profile}: data.held_out_paths.*{message}"):
        get_task(task)(config)
