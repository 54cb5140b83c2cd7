"""DvsGesture on tiny AEDAT 3.1 fixtures: both splits hold every class, label CSV lines are
checked and named, ``pe-bench check-data`` decodes every recording."""

from __future__ import annotations

import pytest
from test_task_events import write_release

from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.data_checks import CorruptFileError, MalformedDatasetError
from pe_bench.tasks.events.aedat import read_aedat31

GESTURES = {
    "user01_led": [(1, 0, 1_000_000), (2, 1_500_000, 3_000_000)],
    "user21_led": [(3, 0, 2_000_000)],
    "user24_natural": [(1, 500_000, 1_500_000), (2, 2_000_000, 2_500_000), (3, 2_600_000, 3_500_000)],
}


def dvsgesture(data_root, num_classes=3):
    config = load_run_config("dvsgesture", "paper", {"data": {"num_classes": num_classes}})
    return get_task("dvsgesture")(config, data_root)


def test_a_class_without_test_gestures_is_named(tmp_path):
    release = write_release(tmp_path, GESTURES | {"user24_natural": [(1, 0, 1_000_000), (2, 1_500_000, 2_000_000)]})
    with pytest.raises(MalformedDatasetError) as err:
        dvsgesture(tmp_path).check_data()
    message = str(err.value)
    assert f"the label CSVs of {release / 'trials_to_test.txt'} lacks 1 classes of data.num_classes=3: 3" in message


def test_a_label_outside_num_classes_is_named_with_file_and_line(tmp_path):
    release = write_release(tmp_path, GESTURES)
    labels = release / "user21_led_labels.csv"  # the first CSV, in trials_to_train.txt order, with a class 3
    with pytest.raises(MalformedDatasetError, match=rf"{labels}:2: class 3 outside 1..2 \(data.num_classes\)"):
        dvsgesture(tmp_path, num_classes=2).check_data()


def test_a_malformed_label_line_is_named(tmp_path):
    release = write_release(tmp_path, GESTURES)
    labels = release / "user01_led_labels.csv"
    labels.write_text(labels.read_text() + "2,soon,later\n")
    with pytest.raises(MalformedDatasetError, match=rf"{labels}:4: expected 'class,startTime_usec,endTime_usec'"):
        dvsgesture(tmp_path).check_data()


def test_a_truncated_recording_is_a_corrupt_file_error_naming_it(tmp_path):
    release = write_release(tmp_path, GESTURES)
    recording = release / "user21_led.aedat"
    recording.write_bytes(recording.read_bytes()[:-100])
    with pytest.raises(CorruptFileError, match=rf"^{recording}: truncated packet at byte"):
        read_aedat31(recording)


def test_check_data_decodes_every_recording_and_lists_each_broken_one(tmp_path, capsys):
    gestures = GESTURES | {"user01_led": [*GESTURES["user01_led"], (3, 5_000_000, 6_000_000)]}  # after the events
    release = write_release(tmp_path, gestures)
    truncated = release / "user24_natural.aedat"
    truncated.write_bytes(truncated.read_bytes()[:-100])
    argv = ["check-data", "--tasks", "dvsgesture", "--data-root", str(tmp_path), "--set", "data.num_classes=3"]
    assert main([*argv, "--workers", "2"]) == 1
    out = capsys.readouterr().out
    assert "dvsgesture: 3 files checked, 2 broken" in out
    assert f"BROKEN {truncated}: truncated packet" in out
    assert f"BROKEN {release / 'user01_led.aedat'}: no events in the labelled gesture" in out
