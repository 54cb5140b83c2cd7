"""UCF101 in its official layout, decoded with PyAV.

Layout under ``--data-root`` (``dataset_dir`` = ucf101)::

    ucf101/UCF-101/<Class>/v_<Class>_gGG_cCC.avi          the 13,320 videos
    ucf101/ucfTrainTestlist/classInd.txt                  "1 ApplyEyeMakeup" ...
    ucf101/ucfTrainTestlist/trainlist0{1,2,3}.txt         "<Class>/<file>.avi <label>"
    ucf101/ucfTrainTestlist/testlist0{1,2,3}.txt          "<Class>/<file>.avi"

Protocol of PaPE Appendix E (following ViViT): a video gives up to ``max_samples``
2-frame tubelets taken ``frame_step`` frames apart (frames 0,1, 10,11, ...); the
validation set is the first video group of every class of the fold's training list.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from pe_bench.harness.data import DatasetMissingError

VIDEO_DIR = "UCF-101"
LIST_DIR = "ucfTrainTestlist"
_GROUP = re.compile(r"_g(\d+)_c\d+")


def ucf101_root(root: Path, fold: int) -> Path:
    """``root`` if it holds the official layout for ``fold``, else an error naming what is missing."""
    needed = [root / VIDEO_DIR, root / LIST_DIR / "classInd.txt"]
    needed += [root / LIST_DIR / f"{kind}list0{fold}.txt" for kind in ("train", "test")]
    missing = [str(path) for path in needed if not path.exists()]
    if missing:
        raise DatasetMissingError(
            f"UCF101 not found: missing {', '.join(missing)}.\n"
            f"Expected layout under {root}:\n"
            f"  {VIDEO_DIR}/<Class>/v_<Class>_gGG_cCC.avi   (UCF101.rar extracted)\n"
            f"  {LIST_DIR}/classInd.txt, trainlist0{{1,2,3}}.txt, testlist0{{1,2,3}}.txt\n"
            "   (UCF101TrainTestSplits-RecognitionTask.zip extracted)\n"
            "Source: https://www.crcv.ucf.edu/data/UCF101.php. pe-bench never downloads it."
        )
    return root


def ucf101_splits(root: Path, fold: int) -> dict[str, list[tuple[Path, int]]]:
    """{"train", "val", "test"} -> [(video path, 0-based label)] for one official fold."""
    lists = root / LIST_DIR
    classes = {}
    for line in (lists / "classInd.txt").read_text().split("\n"):
        if line.strip():
            index, name = line.split()
            classes[name] = int(index) - 1

    def read(kind: str) -> list[tuple[Path, int]]:
        items = []
        for line in (lists / f"{kind}list0{fold}.txt").read_text().split("\n"):
            if line.strip():
                # Test lists carry no label: it is the class folder's.
                relative = line.split()[0]
                items.append((root / VIDEO_DIR / relative, classes[relative.split("/")[0]]))
        return items

    train = read("train")
    first_group: dict[int, int] = defaultdict(lambda: 1 << 30)
    for path, label in train:
        first_group[label] = min(first_group[label], _group(path))
    val = [item for item in train if _group(item[0]) == first_group[item[1]]]
    train = [item for item in train if _group(item[0]) != first_group[item[1]]]
    return {"train": train, "val": val, "test": read("test")}


def _group(path: Path) -> int:
    match = _GROUP.search(path.name)
    if match is None:
        raise ValueError(f"{path}: not a UCF101 file name (v_<Class>_gGG_cCC.avi)")
    return int(match.group(1))


def tubelet_frame_indices(num_frames: int, frame_length: int, frame_step: int, max_samples: int) -> list[int]:
    """Frames 0..L-1, S..S+L-1, ... (up to ``max_samples`` complete tubelets inside the video)."""
    starts = range(0, min(num_frames, max_samples * frame_step), frame_step)
    return [s + i for s in starts if s + frame_length <= num_frames for i in range(frame_length)]


def read_tubelet_frames(path: Path, frame_length: int, frame_step: int, max_samples: int) -> Tensor:
    """(T, 3, H, W) uint8 frames of the sampled tubelets, T a multiple of ``frame_length``."""
    import av  # optional dependency, only needed for the real dataset

    wanted_last = (max_samples - 1) * frame_step + frame_length - 1
    frames: list[np.ndarray] = []
    with av.open(str(path)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index > wanted_last:
                break
            frames.append(frame.to_ndarray(format="rgb24"))
    if not frames:
        raise ValueError(f"{path}: no video frames could be decoded")
    keep = tubelet_frame_indices(len(frames), frame_length, frame_step, max_samples)
    if not keep:
        raise ValueError(f"{path}: {len(frames)} frames, fewer than one tubelet of {frame_length}")
    return torch.from_numpy(np.stack([frames[i] for i in keep])).permute(0, 3, 1, 2)
