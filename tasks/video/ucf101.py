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

from .._shared.data_checks import CorruptFileError, MalformedDatasetError, check_class_lists, some_names

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


def class_index(path: Path) -> dict[str, int]:
    """classInd.txt ("1 ApplyEyeMakeup" ...) -> {name: 0-based label}, numbered 1..N in order."""
    classes: dict[str, int] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[0].isdigit() or int(fields[0]) != len(classes) + 1:
            raise MalformedDatasetError(
                f"{path}:{number}: expected '{len(classes) + 1} <ClassName>' (classes numbered 1..N in order), "
                f"got {line.strip()!r}"
            )
        classes[fields[1]] = len(classes)
    return classes


def read_split_list(path: Path, root: Path, classes: dict[str, int]) -> list[tuple[Path, int]]:
    """A train/test list: "<Class>/<file>.avi [label]" lines -> (video, 0-based label). The
    label is the class folder's; a train list's own label column must agree with it."""
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        relative, folder = fields[0], fields[0].split("/")[0]
        if folder not in classes:
            raise MalformedDatasetError(f"{path}:{number}: class folder {folder!r} is not in classInd.txt")
        if len(fields) > 1 and fields[1] != str(classes[folder] + 1):
            raise MalformedDatasetError(
                f"{path}:{number}: label {fields[1]} for {relative}, but classInd.txt numbers {folder} "
                f"{classes[folder] + 1}"
            )
        items.append((root / VIDEO_DIR / relative, classes[folder]))
    return items


def ucf101_splits(root: Path, fold: int, num_classes: int | None = None) -> dict[str, list[tuple[Path, int]]]:
    """{"train", "val", "test"} -> [(video path, 0-based label)] for one official fold, after
    checking that both lists hold every class of classInd.txt (``num_classes`` of them) and
    that every listed video exists."""
    lists = root / LIST_DIR
    classes = class_index(lists / "classInd.txt")
    train_list, test_list = (lists / f"{kind}list0{fold}.txt" for kind in ("train", "test"))
    train, test = (read_split_list(path, root, classes) for path in (train_list, test_list))
    names = list(classes)
    check_class_lists(
        "UCF101",
        {
            str(lists / "classInd.txt"): names,
            str(train_list): [names[label] for label in {y for _, y in train}],
            str(test_list): [names[label] for label in {y for _, y in test}],
        },
        num_classes,
    )
    missing = [path for path, _ in (*train, *test) if not path.is_file()]
    if missing:
        raise DatasetMissingError(
            f"UCF101: {len(missing)} videos listed in {train_list.name} or {test_list.name} are missing: "
            f"{some_names(missing)}"
        )
    first_group: dict[int, int] = defaultdict(lambda: 1 << 30)
    for path, label in train:
        first_group[label] = min(first_group[label], _group(path))
    val = [item for item in train if _group(item[0]) == first_group[item[1]]]
    train = [item for item in train if _group(item[0]) != first_group[item[1]]]
    return {"train": train, "val": val, "test": test}


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
    try:
        with av.open(str(path)) as container:
            for index, frame in enumerate(container.decode(video=0)):
                if index > wanted_last:
                    break
                frames.append(frame.to_ndarray(format="rgb24"))
    except (av.error.FFmpegError, OSError, IndexError) as err:  # IndexError: no video stream
        raise CorruptFileError(path, f"cannot be decoded as a video ({type(err).__name__}: {err})") from None
    if not frames:
        raise CorruptFileError(path, "no video frames could be decoded")
    keep = tubelet_frame_indices(len(frames), frame_length, frame_step, max_samples)
    if not keep:
        raise CorruptFileError(path, f"{len(frames)} frames, fewer than one tubelet of {frame_length}")
    return torch.from_numpy(np.stack([frames[i] for i in keep])).permute(0, 3, 1, 2)


def check_video(item: tuple[Path, int, int, int]) -> None:
    """Full scan: the video decodes into at least one tubelet, as training reads it."""
    read_tubelet_frames(*item)
