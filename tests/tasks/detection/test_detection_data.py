"""Detection data: COCO and GEN1 loaders on tiny files in their formats, missing datasets,
the generated tiny data, augmentations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from pe_bench.harness.cli import main
from pe_bench.harness.config import ConfigError, load_run_config
from pe_bench.harness.data import DatasetMissingError
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.spiking_patches import SpikingPatches
from pe_bench.tasks.detection.coco import CocoImages, LargeScaleJitter, coco_root, letterbox
from pe_bench.tasks.detection.event_scenes import flashing_box_stream
from pe_bench.tasks.detection.gen1 import (
    Gen1Augmentation,
    decode,
    events_before,
    gen1_root,
    gen1_samples,
    read_boxes,
    read_dat,
    rotate_boxes,
    write_dat,
)
from pe_bench.tasks.detection.synthetic import CLASSES, SceneSpec, relation_scene, write_coco_split
from pe_bench.tasks.detection.task import CocoDataModule, Gen1DataModule

# --------------------------------------------------------------------------- COCO


def write_coco(root, images_per_split=(5, 2)):
    """A COCO 2017 tree: category ids with a gap (3, 7), a crowd box, an image without boxes."""
    for folder, count in zip(("train2017", "val2017"), images_per_split, strict=True):
        (root / folder).mkdir(parents=True)
        images, annotations = [], []
        for i in range(count):
            name = f"{i:012d}.jpg"
            Image.fromarray(np.full((30, 40, 3), 10 * i, dtype=np.uint8)).save(root / folder / name)
            images.append({"id": 100 + i, "file_name": name, "width": 40, "height": 30})
            if i == count - 1:
                continue  # an image without any box
            annotations.append({"id": 2 * i + 1, "image_id": 100 + i, "category_id": 7, "bbox": [4, 3, 10, 6],
                                "area": 60, "iscrowd": 0})  # fmt: skip
            annotations.append({"id": 2 * i + 2, "image_id": 100 + i, "category_id": 3, "bbox": [20, 10, 16, 12],
                                "area": 192, "iscrowd": int(i == 0)})  # fmt: skip
        categories = [{"id": 3, "name": "car"}, {"id": 7, "name": "dog"}]
        (root / "annotations").mkdir(exist_ok=True)
        payload = {"images": images, "annotations": annotations, "categories": categories}
        (root / "annotations" / f"instances_{folder}.json").write_text(json.dumps(payload))


def test_coco_images_map_category_ids_to_classes_and_boxes_to_corners(tmp_path):
    write_coco(tmp_path)
    images = CocoImages(tmp_path, "train2017")
    assert images.class_names == ["car", "dog"] and len(images) == 5
    image, target = images.load(0)
    assert image.shape == (3, 30, 40) and image.dtype == torch.uint8
    assert target["boxes"].tolist() == [[4.0, 3.0, 14.0, 9.0], [20.0, 10.0, 36.0, 22.0]]
    assert target["labels"].tolist() == [1, 0] and target["iscrowd"].tolist() == [False, True]
    assert len(images.load(4)[1]["labels"]) == 0


def test_coco_datamodule_holds_out_part_of_train_and_letterboxes(tmp_path):
    write_coco(tmp_path / "coco")
    config = load_run_config("coco", "paper", {"data": {"image_size": 64, "val_fraction": 0.2, "num_classes": 2}})
    module = CocoDataModule(get_task("coco")(config, tmp_path).data, 2, 0, 0, tmp_path)
    module.setup()
    assert [len(module.splits[s]) for s in ("train", "val", "test")] == [4, 1, 2]
    image, target = module.splits["test"][0]
    # 40 x 30 -> 64 x 48, padded to 64 x 64; boxes scale by 1.6.
    assert image.shape == (3, 64, 64) and image[:, 48:].eq(image[:, 63:, :1]).all()  # zero padding
    assert target["boxes"][0].tolist() == pytest.approx([6.4, 4.8, 22.4, 14.4])
    images, targets = next(iter(module.train_dataloader()))  # large-scale jitter + RandAugment
    assert images.shape == (2, 3, 64, 64) and len(targets) == 2
    for t in targets:
        assert not t["iscrowd"].any()  # crowd boxes are not trained on
        assert (t["boxes"] >= 0).all() and (t["boxes"] <= 64).all()


def test_coco_num_classes_must_match_the_annotations(tmp_path):
    write_coco(tmp_path / "coco")
    config = load_run_config("coco", "paper", {"data": {"image_size": 64}})  # 80 classes, file has 2
    module = CocoDataModule(get_task("coco")(config, tmp_path).data, 2, 0, 0, tmp_path)
    with pytest.raises(ValueError, match="set data.num_classes to 2"):
        module.setup()


def test_large_scale_jitter_keeps_boxes_on_the_canvas():
    image = torch.randint(0, 255, (3, 40, 60), dtype=torch.uint8)
    target = {"boxes": torch.tensor([[5.0, 5.0, 30.0, 20.0]]), "labels": torch.tensor([1]),
              "iscrowd": torch.tensor([False])}  # fmt: skip
    torch.manual_seed(0)
    for _ in range(10):
        out, t = LargeScaleJitter(48)(image, target)
        assert out.shape == (3, 48, 48) and len(t["boxes"]) == len(t["labels"]) <= 1
        assert (t["boxes"] >= 0).all() and (t["boxes"] <= 48).all()


def test_letterbox_scales_the_longer_side():
    image, boxes = letterbox(torch.ones(3, 10, 20, dtype=torch.uint8), torch.tensor([[0.0, 0.0, 20.0, 10.0]]), 40)
    assert image.shape == (3, 40, 40) and image[:, :20].all() and not image[:, 20:].any()
    assert boxes.tolist() == [[0.0, 0.0, 40.0, 20.0]]


def test_missing_coco_names_the_path_the_layout_and_the_source(tmp_path):
    with pytest.raises(DatasetMissingError) as err:
        coco_root(tmp_path / "coco")
    message = str(err.value)
    assert str(tmp_path / "coco" / "train2017") in message
    assert "instances_val2017.json" in message and "cocodataset.org" in message
    code = main(["run", "--tasks", "coco", "--methods", "rope", "--profile", "paper",
                 "--data-root", str(tmp_path), "--out", str(tmp_path / "out")])  # fmt: skip
    assert code != 0


def test_relation_scene_classes_are_quadrants_seen_from_the_marker_cell():
    rng = np.random.default_rng(3)
    counts = np.zeros(len(CLASSES), dtype=int)
    for _ in range(30):
        scene = relation_scene(rng, SceneSpec(64, (2, 4), (8, 20), cell=8))
        image = scene.image
        assert image.shape == (64, 64, 3) and image.min() >= 0 and image.max() <= 1
        # The marker is the only pure-white plus: its white pixels lie in one 8-px cell, the one
        # the scene names (the attention probe relies on it).
        rows, cols = np.nonzero(np.all(image == 1.0, axis=-1))
        assert len(set(rows // 8)) == 1 and len(set(cols // 8)) == 1
        row, col = rows[0] // 8, cols[0] // 8
        assert scene.marker == (row, col)
        for (x, y, w, h), label in zip(scene.boxes, scene.labels, strict=True):
            # Every cell the box touches is strictly off the marker's row and column of cells.
            cell_rows, cell_cols = range(y // 8, (y + h - 1) // 8 + 1), range(x // 8, (x + w - 1) // 8 + 1)
            assert row not in cell_rows and col not in cell_cols
            vertical = "below" if cell_rows[0] > row else "above"
            horizontal = "right" if cell_cols[0] > col else "left"
            assert CLASSES[label] == f"{vertical}-{horizontal}"
            counts[label] += 1
    assert counts.min() > 0.15 * counts.sum()  # every class is common


def test_relation_scene_rejects_a_cell_that_does_not_tile_the_image():
    with pytest.raises(ValueError, match="multiple of the cell"):
        relation_scene(np.random.default_rng(0), SceneSpec(64, (2, 4), (8, 20), cell=7))


def test_generated_coco_cell_must_be_the_patch(tmp_path):
    config = load_run_config("coco", "tiny", {"data": {"cell": 4}})
    with pytest.raises(ConfigError, match="data.cell"):
        get_task("coco")(config, tmp_path)  # refused with the task, before any model or data


def test_tiny_coco_split_is_a_coco_file_the_loader_reads(tmp_path):
    write_coco_split(tmp_path, "train2017", 3, SceneSpec(32, (1, 2), (6, 10), cell=8))
    images = CocoImages(tmp_path, "train2017")
    assert len(images) == 3 and images.class_names == list(CLASSES)
    image, target = images.load(0)
    assert image.shape == (3, 32, 32) and 1 <= len(target["labels"]) <= 2


# --------------------------------------------------------------------------- GEN1


def write_recording(folder, name, events, boxes_rows, time_field="ts"):
    folder.mkdir(parents=True, exist_ok=True)
    write_dat(folder / f"{name}_td.dat", *events, width=304, height=240)
    dtype = [(time_field, "<u8"), ("x", "<f4"), ("y", "<f4"), ("w", "<f4"), ("h", "<f4"), ("class_id", "u1"),
             ("confidence", "<f4"), ("track_id", "<u4")]  # fmt: skip
    np.save(folder / f"{name}_bbox.npy", np.array(boxes_rows, dtype=dtype))


def synthetic_events(n, duration_us, seed=0):
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(0, duration_us, n)).astype(np.int64)
    return (rng.integers(0, 304, n).astype(np.uint16), rng.integers(0, 240, n).astype(np.uint16), t,
            rng.integers(0, 2, n).astype(bool))  # fmt: skip


def write_gen1(root):
    events = synthetic_events(20_000, 2_000_000)
    rows = [(600_000, 10, 20, 50, 40, 0, 1, 1), (600_000, 100, 100, 30, 60, 1, 1, 2),
            (600_000, 200, 200, 5, 5, 1, 1, 3),  # too small: filtered out
            (1_500_000, 280, 200, 50, 60, 0, 1, 1),  # crosses the sensor border: clipped
            (100_000, 10, 20, 50, 40, 0, 1, 1),  # in the first 0.5 s: skipped
            (500_000, 10, 20, 50, 40, 0, 1, 1)]  # at 0.5 s exactly: skipped (Prophesee's ts > skip_ts)  # fmt: skip
    for split in ("train", "val", "test"):
        write_recording(root / split, f"rec_{split}", events, rows, time_field="ts" if split != "test" else "t")
    return events


def test_dat_files_round_trip(tmp_path):
    events = synthetic_events(500, 100_000)
    write_dat(tmp_path / "a_td.dat", *events, width=304, height=240)
    assert (tmp_path / "a_td.dat").read_bytes().startswith(b"% Data file")
    for got, want in zip(decode(np.asarray(read_dat(tmp_path / "a_td.dat"))), events, strict=True):
        np.testing.assert_array_equal(got, want)


def test_truncated_dat_file_is_an_error_naming_it(tmp_path):
    write_dat(tmp_path / "b_td.dat", *synthetic_events(10, 1000), width=304, height=240)
    path = tmp_path / "b_td.dat"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match="b_td.dat: truncated"):
        read_dat(path)


def test_gen1_samples_filter_clip_and_window(tmp_path):
    events = write_gen1(tmp_path)
    times, boxes, labels = read_boxes(tmp_path / "test" / "rec_test_bbox.npy")  # "t" instead of "ts"
    assert times[0] == 600_000 and boxes[0].tolist() == [10, 20, 60, 60] and labels[0] == 0
    samples = gen1_samples(tmp_path / "train", 304, 240, min_box_diagonal=30, min_box_side=10, skip_us=500_000)
    assert [s.time_us for s in samples] == [600_000, 1_500_000]
    assert samples[0].labels.tolist() == [0, 1] and samples[1].boxes.tolist() == [[280, 200, 304, 240]]
    x, y, t, p = events_before(samples[0].recording, 600_000, window=1000)
    end = np.searchsorted(events[2], 600_000, side="right")
    assert len(t) == 1000 and t[0] == 0 and t[-1] == events[2][end - 1] - events[2][end - 1000]
    np.testing.assert_array_equal(x, events[0][end - 1000 : end])


def test_gen1_datamodule_tokenizes_windows_with_their_boxes(tmp_path):
    write_gen1(tmp_path / "gen1")
    config = load_run_config("gen1", "paper", {"data": {"threshold": 8, "refractory_us": 1000, "window_events": 5000}})
    module = Gen1DataModule(get_task("gen1")(config, tmp_path).data, 16, 2, 0, 0, tmp_path)
    module.setup()
    assert [len(module.splits[s]) for s in ("train", "val", "test")] == [2, 2, 2]
    batch, targets = next(iter(module.val_dataloader()))
    assert batch.features.shape[2:] == (2, 10, 16, 16) and batch.valid.any(1).all()
    assert batch.coords[..., 0].max() < 19 and batch.coords[..., 1].max() < 15  # 304 x 240 in 16-px patches
    assert [t["labels"].tolist() for t in targets] == [[0, 1], [0]]
    batch, targets = next(iter(module.train_dataloader()))  # rotation + EventDrop
    assert all((t["boxes"] >= 0).all() and (t["boxes"][:, 2] <= 304).all() for t in targets)


def test_missing_gen1_names_the_path_the_layout_and_the_source(tmp_path):
    with pytest.raises(DatasetMissingError) as err:
        gen1_root(tmp_path / "gen1")
    message = str(err.value)
    assert str(tmp_path / "gen1" / "train") in message and "_bbox.npy" in message and "prophesee" in message
    (tmp_path / "gen1" / "train").mkdir(parents=True)
    write_recording(tmp_path / "gen1" / "val", "x", synthetic_events(10, 1000), [])
    (tmp_path / "gen1" / "val" / "x_bbox.npy").unlink()
    write_recording(tmp_path / "gen1" / "test", "x", synthetic_events(10, 1000), [])
    with pytest.raises(DatasetMissingError, match="train has no"):
        gen1_root(tmp_path / "gen1")
    with pytest.raises(DatasetMissingError, match="x_bbox.npy is missing"):
        gen1_samples(tmp_path / "gen1" / "val", 304, 240, 30, 10, 0)


def test_rotating_boxes_follows_the_events():
    boxes = np.array([[100.0, 100.0, 140.0, 120.0]], dtype=np.float32)
    turned = rotate_boxes(boxes, 90.0, 304, 240)
    # About the centre (152, 120), 90 degrees maps (x, y) -> (152 - (y - 120), 120 + (x - 152)).
    np.testing.assert_allclose(turned, [[152.0, 68.0, 172.0, 108.0]], atol=1e-4)
    events = (np.array([110], dtype=np.uint16), np.array([110], dtype=np.uint16), np.array([5]), np.array([True]))
    (x, y, _, _), box, _ = Gen1Augmentation(304, 240, max_degrees=0.0)(
        events, boxes, np.array([1]), np.random.default_rng(0)
    )
    assert box.tolist() == boxes.tolist()


def test_emulated_streams_label_each_object_at_its_last_flash():
    rng = np.random.default_rng(5)
    tokenizer = SpikingPatches(64, 64, 8, threshold=16, refractory_us=20_000, buckets=8)
    for _ in range(10):
        (x, y, t, p), boxes, labels = flashing_box_stream(rng)
        assert 1 <= len(labels) <= 2 and (boxes >= 0).all() and (boxes <= 64).all()
        w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        assert ((w > h) == (labels == 0)).all()  # cars are wide, pedestrians tall
        tokens = tokenizer(x, y, t, p)
        # The stream's last tokens are the switching-off of a labelled box.
        last = (tokens.x[-1] * 8 + 4, tokens.y[-1] * 8 + 4)
        near = [(b[0] - 8 <= last[0] <= b[2] + 8) and (b[1] - 8 <= last[1] <= b[3] + 8) for b in boxes]
        assert any(near) and tokens.features[-1, 0].sum() > 0  # polarity 0: OFF events
