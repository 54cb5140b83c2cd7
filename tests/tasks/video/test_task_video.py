"""ucf101: motion clips, ViViT masking, the official-layout loader (tiny .avi files), end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.harness.data import DatasetMissingError
from pe_bench.harness.grid import store
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.motion import MOTIONS, sample_motion
from pe_bench.tasks.video.synthetic import motion_clips
from pe_bench.tasks.video.task import VideoDataModule
from pe_bench.tasks.video.ucf101 import read_tubelet_frames, tubelet_frame_indices, ucf101_root, ucf101_splits
from pe_bench.tasks.video.vivit import VideoBatch


def test_motion_partners_are_time_reversals_of_each_other():
    u = np.linspace(0, 1, 3)

    def paths(label):
        found = set()
        for seed in range(500):
            cells = sample_motion(label, 4, 3, np.random.default_rng(seed)).positions(u)[:, 0]
            assert np.allclose(cells, np.rint(cells)) and cells.min() >= 0 and cells.max() <= 3
            found.add(tuple(map(tuple, np.rint(cells).astype(int).tolist())))
        return found

    for label in range(0, len(MOTIONS), 2):
        forward, backward = paths(label), paths(label + 1)
        # The same cells in the opposite order: without time the partners are one class.
        assert {path[::-1] for path in forward} == backward, MOTIONS[label]
        assert not forward & backward
    with pytest.raises(ValueError, match="do not fit"):
        sample_motion(MOTIONS.index("right"), 3, 4, np.random.default_rng(0))


def test_motion_clips_are_balanced_deterministic_and_static_within_tubelets():
    clips, labels = motion_clips(16, 8, grid=5, patch=4, steps=3, tubelet=2, noise=0.0, seed=0)
    again, _ = motion_clips(16, 8, grid=5, patch=4, steps=3, tubelet=2, noise=0.0, seed=0)
    assert clips.shape == (16, 3, 6, 20, 20) and torch.equal(clips, again)
    assert torch.bincount(labels).tolist() == [2] * 8
    # Without noise both frames of a tubelet are identical: tokens carry no motion cue.
    assert torch.equal(clips[:, :, 0::2], clips[:, :, 1::2])
    assert not torch.equal(clips[:, :, 0], clips[:, :, 2])
    # Every clip, whatever its class, is 3 disk and 3 ring tubelet-tokens on background:
    # the bag of token contents (all that nopos sees) is the same for every class.
    tokens = clips[:, 0, 0::2].unflatten(2, (5, 4)).unflatten(4, (5, 4)).abs().sum((3, 5))  # (16, 3, 5, 5)
    lit = (tokens > 0).flatten(1).sum(1)
    assert lit.tolist() == [6] * 16


def test_vivit_masks_missing_tubelets():
    config = load_run_config("ucf101", "tiny", {"model": {"dim": 32, "depth": 2, "head_init": "default"}})
    task = get_task("ucf101")(config)
    assert task.geometry().grid_shape == (3, 3, 3)
    for method in ("rope", "pape", "sincos"):
        torch.manual_seed(0)
        model = task.build_model(EncodingFactory(method, config.methods.get(method, {}))).eval()
        video = torch.randn(2, 3, 6, 12, 12)
        other = video.clone()
        other[:, :, 4:] = torch.randn(2, 3, 2, 12, 12)  # only the padded third tubelet changes
        steps = torch.tensor([2, 2])
        with torch.no_grad():
            out = model(VideoBatch(video, steps))
            torch.testing.assert_close(out, model(VideoBatch(other, steps)), msg=method)
            assert not torch.allclose(out, model(VideoBatch(other, torch.tensor([3, 3]))))


def test_tubelet_frame_indices_follow_the_vivit_sampling():
    assert tubelet_frame_indices(25, 2, 10, 5) == [0, 1, 10, 11, 20, 21]
    assert tubelet_frame_indices(100, 2, 10, 5) == [0, 1, 10, 11, 20, 21, 30, 31, 40, 41]
    assert tubelet_frame_indices(21, 2, 10, 5) == [0, 1, 10, 11]  # frame 20 has no partner


def write_avi(path, frames, width=32, height=24):
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            image = np.full((height, width, 3), (i * 9) % 256, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_ucf101(root):
    """2 classes x 3 groups x 1 clip in the official layout; fold 1 tests group 1."""
    root = root / "ucf101"
    lists = root / "ucfTrainTestlist"
    lists.mkdir(parents=True)
    (lists / "classInd.txt").write_text("1 ApplyLipstick\n2 Basketball\n")
    train, test = [], []
    for index, name in enumerate(("ApplyLipstick", "Basketball")):
        for group, frames in ((1, 12), (2, 25), (3, 45)):
            relative = f"{name}/v_{name}_g{group:02d}_c01.avi"
            write_avi(root / "UCF-101" / relative, frames)
            (test.append(relative) if group == 1 else train.append(f"{relative} {index + 1}"))
    (lists / "trainlist01.txt").write_text("\n".join(train) + "\n")
    (lists / "testlist01.txt").write_text("\n".join(test) + "\n")
    return root


def test_ucf101_loader_reads_official_layout_with_pyav(tmp_path):
    root = write_ucf101(tmp_path)
    splits = ucf101_splits(ucf101_root(root, 1), 1)
    names = {k: sorted(p.name for p, _ in v) for k, v in splits.items()}
    assert names["val"] == ["v_ApplyLipstick_g02_c01.avi", "v_Basketball_g02_c01.avi"]  # first train group
    assert names["train"] == ["v_ApplyLipstick_g03_c01.avi", "v_Basketball_g03_c01.avi"]
    assert sorted(label for _, label in splits["test"]) == [0, 1]
    frames = read_tubelet_frames(root / "UCF-101/Basketball/v_Basketball_g02_c01.avi", 2, 10, 5)
    assert frames.shape == (6, 3, 24, 32) and frames.dtype == torch.uint8
    assert abs(int(frames[2].float().mean()) - 90) < 12  # frame 10 decoded, not frame 2

    data = {"image_height": 32, "image_width": 48, "fold": 1, "num_classes": 2}
    overrides = {"data": data, "model": {"patch_size": 16}}
    config = load_run_config("ucf101", "paper", overrides)
    module = VideoDataModule(get_task("ucf101")(config).data, 16, 2, 0, 0, tmp_path)
    module.setup()
    batch, labels = next(iter(module.test_dataloader()))
    assert batch.video.shape == (2, 3, 10, 32, 48) and batch.steps.tolist() == [2, 2]
    assert labels.tolist() == [0, 1] and batch.video[:, :, 4:].abs().sum() == 0  # 12 frames: 2 tubelets
    batch, _ = next(iter(module.train_dataloader()))  # RandAugment + flip path
    assert batch.steps.tolist() == [5, 5]


def test_missing_ucf101_names_the_path_and_the_layout(tmp_path):
    with pytest.raises(DatasetMissingError) as err:
        ucf101_root(tmp_path / "ucf101", 2)
    message = str(err.value)
    assert str(tmp_path / "ucf101" / "UCF-101") in message and "trainlist02.txt" in message
    assert "classInd.txt" in message and "crcv.ucf.edu" in message


def test_ucf101_tiny_cell_end_to_end(tmp_path):
    small = ["--set", "optim.epochs=1", "--set", "data.train_size=64", "--set", "data.val_size=16",
             "--set", "data.test_size=16", "--set", "model.dim=32", "--set", "model.depth=1"]  # fmt: skip
    assert main(["run", "--tasks", "ucf101", "--methods", "rope-mixed,lookhere", "--out", str(tmp_path), *small]) == 0
    record = json.loads((store.cell_dir(tmp_path, "ucf101", "rope-mixed", 0) / "result.json").read_text())
    assert record["status"] == "ok" and 0 <= record["score"] <= 100
    lookhere = json.loads((store.cell_dir(tmp_path, "ucf101", "lookhere", 0) / "result.json").read_text())
    assert lookhere["status"] == "n/a"  # 2-D-only encodings are n/a for (t, y, x)
