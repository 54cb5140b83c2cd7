"""How much of the tiny gen1 and nuscenes test splits repeats training (the README's audit rows).

A test score near 100 on configurations that training has already shown (the few discrete draws
a label depends on) could come from a lookup of those configurations as well as from the
relation the task is meant to test. The README's table "How much of each test split repeats
training" gives, per tiny task, the share of test samples whose configuration training shows;
these tests replay the gen1 and nuscenes rows through each task's own data module (tiny profile,
its fixed data seeds and split sizes), so the table cannot drift from the generators:

* gen1: a configuration is one object's ordered trail of flash boxes. No test trail is a
  training one (the boxes are continuous draws), and 5.1 % of the test objects repeat a training
  object's class and ordered trail of patch cells (the 8-px cells each flash box covers).
* nuscenes: the class is the object's colour, and a configuration is (class, the 1 m BEV voxel
  of the box centre: the head's heatmap cell). Training shows 459 of them and 98.9 % of the test
  objects' are among them, but no test scene repeats a training scene's colour-to-object
  assignment (its set of (class, voxel)): not even its set of object voxels.

And no test input is an exact copy of a training input on either task.

The training set is each task's train split as its data module builds it. Both tasks draw
validation from a seed of its own (train, val, test: 9000-9002 for gen1, 4000-4002 for
nuscenes), so nothing is taken out of training for validation, unlike coco's ``held_out``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from pe_bench.harness.config import load_run_config
from pe_bench.tasks._shared.data_checks import share_seen
from pe_bench.tasks.base import get_task
from pe_bench.tasks.detection import event_scenes
from pe_bench.tasks.detection import task as detection_task
from pe_bench.tasks.nuscenes import task as nuscenes_task


def digest(*arrays: np.ndarray | torch.Tensor) -> str:
    """One hash of the arrays' bytes, dtypes and shapes: equal inputs, equal digests."""
    h = hashlib.sha1()
    for a in arrays:
        a = a.numpy() if isinstance(a, torch.Tensor) else a
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def gen1() -> Iterator[dict]:
    """The tiny gen1 splits as ``Gen1DataModule.setup`` makes them, with every object's trail.

    The task reads ``flashing_box_streams``, the (stream, boxes, classes) of
    ``flashing_box_scenes``; the replay has the task call ``flashing_box_scenes`` with the
    arguments it passes and keeps the scenes, whose trails end at the returned boxes.
    ``_emulated`` runs unwrapped (its cache stays as it was)."""
    config = load_run_config("gen1", "tiny")
    task = get_task("gen1")(config)
    made: list[tuple[int, int, list[event_scenes.FlashingBoxScene]]] = []

    def recorded_streams(count, seed, **options):
        scenes = event_scenes.flashing_box_scenes(count, seed, **options)
        made.append((count, seed, scenes))
        return [scene.sample for scene in scenes]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(detection_task, "flashing_box_streams", recorded_streams)
        patch.setattr(detection_task, "_emulated", detection_task._emulated.__wrapped__)
        module = task.datamodule(0)
        module.setup()
    splits = {}
    for name, (count, seed, scenes) in zip(("train", "val", "test"), made, strict=True):
        assert len(module.splits[name]) == count == len(scenes)
        objects = []
        for i, scene in enumerate(scenes):
            events, boxes, labels = module.splits[name].load(i)
            assert events is scene.events and boxes is scene.boxes and labels is scene.labels, f"{name} {i}"
            assert [t[-1] for t in scene.trails] == [tuple(b) for b in boxes.astype(int).tolist()], (
                "trails end at the boxes"
            )
            objects += [(int(label), trail) for label, trail in zip(labels, scene.trails, strict=True)]
        splits[name] = {
            "seed": seed,
            "samples": [module.splits[name].load(i) for i in range(count)],
            "objects": objects,
        }
    yield {"splits": splits, "patch": config.model.patch_size}


@pytest.fixture(scope="module")
def nuscenes() -> Iterator[dict]:
    """The tiny nuscenes splits as the task's data module makes them (``_scenes`` unwrapped, so
    its cache stays as it was; one torch thread, as the grid's ``trainer.threads=1``)."""
    config = load_run_config("nuscenes", "tiny")
    task = get_task("nuscenes")(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(nuscenes_task, "_scenes", nuscenes_task._scenes.__wrapped__)
            module = task.datamodule(0)
            module.setup()
    finally:
        torch.set_num_threads(threads)
    splits = {name: [split[i] for i in range(len(split))] for name, split in module.splits.items()}
    yield {"splits": splits, "grid": task.data.grid}


def test_gen1_replays_the_tiny_profile(gen1: dict) -> None:
    splits = gen1["splits"]
    assert {name: (s["seed"], len(s["samples"])) for name, s in splits.items()} == {
        "train": (9000, 2000),
        "val": (9001, 200),
        "test": (9002, 400),
    }
    assert len(splits["train"]["objects"]) == 3009 and len(splits["test"]["objects"]) == 592


def test_gen1_no_test_trail_is_a_training_trail(gen1: dict) -> None:
    """The audit's 0 %: trails are continuous draws, every training object's trail is its own."""
    train = [trail for _, trail in gen1["splits"]["train"]["objects"]]
    test = [trail for _, trail in gen1["splits"]["test"]["objects"]]
    assert len(set(train)) == len(train), "continuous: no two training objects share a trail"
    assert share_seen(train, test) == 0.0


def test_gen1_test_objects_repeat_training_by_patch_cells(gen1: dict) -> None:
    """The audit's 5.1 %: (class, the ordered patch cells each flash box covers: first and last
    column and row of patch_size-px cells) of 30 of the 592 test objects are a training
    object's. (Without the class, 34 of 592: 5.7 %.)"""
    p = gen1["patch"]

    def cells(label: int, trail: tuple[event_scenes.Box, ...]) -> tuple:
        return label, tuple((x1 // p, y1 // p, (x2 - 1) // p, (y2 - 1) // p) for x1, y1, x2, y2 in trail)

    train = [cells(*o) for o in gen1["splits"]["train"]["objects"]]
    test = [cells(*o) for o in gen1["splits"]["test"]["objects"]]
    assert share_seen(train, test) == pytest.approx(0.051, abs=5e-4)


def object_voxels(scene: dict, grid) -> list[tuple[int, tuple[int, int]]]:
    """(class, BEV voxel (x, y) of the box centre) of a scene's annotated objects."""
    voxels = grid.cells(scene["boxes"][:, :3])[:, :2].tolist()
    return [(int(label), (x, y)) for label, (x, y) in zip(scene["labels"], voxels, strict=True)]


def test_nuscenes_test_objects_repeat_training_class_voxels(nuscenes: dict) -> None:
    """The audit's 459 and 98.9 % (350 of the 354 test objects)."""
    train = [o for scene in nuscenes["splits"]["train"] for o in object_voxels(scene, nuscenes["grid"])]
    test = [o for scene in nuscenes["splits"]["test"] for o in object_voxels(scene, nuscenes["grid"])]
    assert len(set(train)) == 459
    assert share_seen(train, test) == pytest.approx(0.989, abs=5e-4)


def test_nuscenes_no_test_scene_repeats_a_training_assignment(nuscenes: dict) -> None:
    """No test scene's colour-to-object assignment (its set of (class, voxel)) is a training
    scene's, nor even its set of object voxels without the colours."""
    grid = nuscenes["grid"]

    def assignment(scene: dict) -> frozenset:
        return frozenset(object_voxels(scene, grid))

    def places(scene: dict) -> frozenset:
        return frozenset(voxel for _, voxel in object_voxels(scene, grid))

    train, test = nuscenes["splits"]["train"], nuscenes["splits"]["test"]
    assert share_seen(map(assignment, train), [assignment(s) for s in test]) == 0.0
    assert share_seen(map(places, train), [places(s) for s in test]) == 0.0


@pytest.mark.parametrize("task", ["gen1", "nuscenes"])
def test_no_test_input_is_a_training_input(task: str, request: pytest.FixtureRequest) -> None:
    """gen1: a stream's events (x, y, t, p); nuscenes: a scene's LiDAR points and camera images."""
    data = request.getfixturevalue(task)
    if task == "gen1":
        inputs = {name: [digest(*events) for events, _, _ in s["samples"]] for name, s in data["splits"].items()}
    else:
        inputs = {name: [digest(s["points"], s["images"]) for s in scenes] for name, scenes in data["splits"].items()}
    assert len(set(inputs["train"])) == len(inputs["train"]), "the training inputs differ among themselves"
    assert not set(inputs["test"]) & set(inputs["train"])
