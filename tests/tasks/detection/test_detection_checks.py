"""``pe-bench check-data`` on the detection tasks: the tiny profiles have nothing on disk, the
paper profiles read COCO's annotation files and images and GEN1's recordings, and every
broken file is listed."""

from __future__ import annotations

import pytest
from test_detection_data import write_coco, write_gen1

from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.data_checks import DataReport, MalformedDatasetError


@pytest.mark.parametrize("name", ["coco", "gen1"])
def test_check_data_takes_the_base_signature_and_returns_a_report(name):
    task = get_task(name)(load_run_config(name, "tiny", {}), None)
    report = task.check_data(full=True, workers=2)
    assert isinstance(report, DataReport) and report.ok and report.checked == 0
    assert "nothing on disk to check" in report.format()


def test_check_data_on_the_tiny_profiles_through_the_cli(capsys):
    assert main(["check-data", "--tasks", "coco,gen1", "--profile", "tiny", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "coco: 0 files checked, ok" in out and "gen1: 0 files checked, ok" in out
    assert "2 of 2 datasets ok" in out


def test_check_data_reads_every_coco_image_and_gen1_recording(tmp_path, capsys):
    write_coco(tmp_path / "coco")  # 2 categories, 5 + 2 images
    write_gen1(tmp_path / "gen1")  # one recording per split
    argv = ["check-data", "--tasks", "coco,gen1", "--data-root", str(tmp_path), "--set", "data.num_classes=2"]
    assert main([*argv, "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "coco: 7 files checked, ok" in out and "2 categories; images: 5 train2017, 2 val2017" in out
    assert "gen1: 6 files checked, ok" in out and "recordings: 1 train, 1 val, 1 test" in out

    image = tmp_path / "coco" / "val2017" / "000000000001.jpg"
    image.write_bytes(b"not a jpeg")
    recording = tmp_path / "gen1" / "val" / "rec_val_td.dat"
    recording.write_bytes(recording.read_bytes()[:-3])
    (tmp_path / "gen1" / "test" / "rec_test_bbox.npy").unlink()
    assert main([*argv, "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "coco: 7 files checked, 1 broken" in out and f"BROKEN {image}: cannot be decoded as an image" in out
    assert "gen1: 6 files checked, 2 broken" in out and f"BROKEN {recording}: truncated" in out
    assert f"BROKEN {tmp_path / 'gen1' / 'test' / 'rec_test_bbox.npy'}: is missing" in out


def test_coco_check_names_a_category_count_that_is_not_num_classes(tmp_path):
    write_coco(tmp_path / "coco")
    task = get_task("coco")(load_run_config("coco", "paper", {}), tmp_path)  # 80 classes, the files have 2
    task.check_data()  # the quick check reads the layout only
    with pytest.raises(MalformedDatasetError, match=r"data.num_classes is 80.*train2017: 2, val2017: 2"):
        task.check_data(full=True)


def test_coco_annotation_files_with_other_category_ids_are_refused(tmp_path):
    """Each file maps its own sorted ids to labels: train {3, 7} against val {3, 9} would make
    label 1 "dog" in training and another class at test, with the counts equal (audit, stop 71)."""
    import json

    write_coco(tmp_path / "coco")
    path = tmp_path / "coco" / "annotations" / "instances_val2017.json"
    payload = json.loads(path.read_text())
    payload["categories"] = [{"id": 3, "name": "car"}, {"id": 9, "name": "cat"}]
    payload["annotations"] = [{**a, "category_id": 9 if a["category_id"] == 7 else 3} for a in payload["annotations"]]
    path.write_text(json.dumps(payload))
    task = get_task("coco")(load_run_config("coco", "paper", {"data": {"num_classes": 2}}), tmp_path)
    with pytest.raises(
        MalformedDatasetError, match=r"train2017 and val2017 list other category ids \(in one only: \[7, 9\]\)"
    ):
        task.check_data(full=True)
    data = task.datamodule(0)
    with pytest.raises(MalformedDatasetError, match="list other category ids"):
        data.setup("fit")
