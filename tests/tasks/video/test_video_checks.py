"""UCF101 on tiny .avi fixtures in the official layout: classInd.txt and the fold's lists agree,
undecodable videos are named, ``pe-bench check-data`` lists every broken one."""

from __future__ import annotations

import pytest
from test_task_video import write_avi, write_ucf101

from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.data_checks import CorruptFileError, MalformedDatasetError
from pe_bench.tasks.video.task import VideoDataModule

FOLD1 = {"fold": 1, "num_classes": 2}


def ucf101(data_root, **data):
    return get_task("ucf101")(load_run_config("ucf101", "paper", {"data": FOLD1 | data}), data_root)


def test_a_test_list_without_a_class_of_classind_is_named(tmp_path):
    root = write_ucf101(tmp_path)
    test_list = root / "ucfTrainTestlist" / "testlist01.txt"
    test_list.write_text("ApplyLipstick/v_ApplyLipstick_g01_c01.avi\n")
    with pytest.raises(MalformedDatasetError) as err:
        ucf101(tmp_path).check_data()
    assert f"{test_list} lacks 1 classes of {root / 'ucfTrainTestlist' / 'classInd.txt'}: Basketball" in str(err.value)


def test_classind_must_count_num_classes(tmp_path):
    write_ucf101(tmp_path)
    with pytest.raises(MalformedDatasetError, match=r"data.num_classes=101 but .*classInd.txt has 2 classes"):
        ucf101(tmp_path, num_classes=101).check_data()


def test_a_train_label_that_disagrees_with_classind_is_named_with_its_line(tmp_path):
    root = write_ucf101(tmp_path)
    train_list = root / "ucfTrainTestlist" / "trainlist01.txt"
    lines = train_list.read_text().splitlines()
    lines[2] = lines[2].replace(" 2", " 1")  # a Basketball video labelled as class 1
    train_list.write_text("\n".join(lines) + "\n")
    with pytest.raises(MalformedDatasetError, match=rf"{train_list}:3: label 1 for Basketball/.*numbers Basketball 2"):
        ucf101(tmp_path).check_data()


def test_a_class_folder_missing_from_classind_is_named_with_its_line(tmp_path):
    root = write_ucf101(tmp_path)
    (root / "ucfTrainTestlist" / "classInd.txt").write_text("1 ApplyLipstick\n")
    train_list = root / "ucfTrainTestlist" / "trainlist01.txt"
    with pytest.raises(MalformedDatasetError, match=rf"{train_list}:3: class folder 'Basketball' is not in classInd"):
        ucf101(tmp_path, num_classes=1).check_data()


def test_an_undecodable_video_is_an_error_naming_it(tmp_path):
    root = write_ucf101(tmp_path)
    broken = root / "UCF-101" / "Basketball" / "v_Basketball_g01_c01.avi"
    broken.write_bytes(b"not a video at all" * 50)
    module = VideoDataModule(ucf101(tmp_path).data, 16, 2, 0, 0, tmp_path)
    module.setup()
    with pytest.raises(CorruptFileError) as err:
        list(module.test_dataloader())
    assert str(err.value).startswith(f"{broken}: cannot be decoded as a video")


def test_check_data_decodes_every_video_and_lists_each_broken_one(tmp_path, capsys):
    root = write_ucf101(tmp_path)
    argv = ["check-data", "--tasks", "ucf101", "--data-root", str(tmp_path), "--workers", "2"]
    argv += ["--set", "data.fold=1", "--set", "data.num_classes=2"]
    assert main(argv) == 0
    assert "ucf101: 6 files checked, ok" in capsys.readouterr().out
    garbage = root / "UCF-101" / "ApplyLipstick" / "v_ApplyLipstick_g03_c01.avi"
    garbage.write_bytes(b"\x00" * 100)
    one_frame = root / "UCF-101" / "Basketball" / "v_Basketball_g02_c01.avi"
    write_avi(one_frame, 1)
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "ucf101: 6 files checked, 2 broken" in out
    assert f"BROKEN {garbage}: cannot be decoded as a video" in out
    assert f"BROKEN {one_frame}: 1 frames, fewer than one tubelet of 2" in out
