"""The detections the evaluation scores: on GEN1, Prophesee's box-size rule drops detections as it
drops ground truth (psee_evaluator.py filters both); the emulated tiny streams and COCO score
every detection."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pe_bench.harness.config import load_run_config
from pe_bench.tasks import get_task
from pe_bench.tasks.detection.gen1 import BoxSizeFilter, gen1_samples, write_dat
from pe_bench.tasks.detection.head import BranchOutput, DetectorOutput

LARGE_CAR = [10.0, 10.0, 70.0, 50.0]  # 60 x 40 px: kept by the rule
SMALL_CAR = [200.0, 100.0, 220.0, 108.0]  # 20 x 8 px, diagonal 21.5: left out by the rule


class FixedDetector(nn.Module):
    """Both heads find both cars exactly, the small one with the higher score (class 0; class 1
    scores near 0)."""

    def forward(self, inputs):
        boxes = torch.tensor([[SMALL_CAR, LARGE_CAR]])
        logits = torch.tensor([[[3.0, -20.0], [2.0, -20.0]]])
        branch = BranchOutput(logits, torch.zeros(1, 2, 4, 8), boxes)
        return DetectorOutput(torch.zeros(2, 2), torch.ones(2), branch, branch)


def labelled_time(tmp_path):
    """The ground truth of one labelled time of a GEN1 recording with both cars: the small one is filtered."""
    write_dat(tmp_path / "rec_td.dat", np.array([1, 2]), np.array([1, 2]), np.array([600_000, 1_000_000]),
              np.array([0, 1]), 304, 240)  # fmt: skip
    dtype = [("t", "<u8"), ("x", "<f4"), ("y", "<f4"), ("w", "<f4"), ("h", "<f4"), ("class_id", "<u4")]
    rows = [(1_000_000, 10, 10, 60, 40, 0), (1_000_000, 200, 100, 20, 8, 0)]
    np.save(tmp_path / "rec_bbox.npy", np.array(rows, dtype=dtype))
    (sample,) = gen1_samples(tmp_path, 304, 240, 30.0, 10.0, 500_000)
    assert sample.boxes.tolist() == [LARGE_CAR]
    return {"boxes": torch.from_numpy(sample.boxes), "labels": torch.from_numpy(sample.labels)}


def scores(task_name, profile, truth):
    """Validation mAP and test mAP of both heads of the fixed detector under the task's module."""
    task = get_task(task_name)(load_run_config(task_name, profile, {}), None)
    module = task.lightning_module(FixedDetector())
    module.validation_step((None, [truth]), 0)
    module.test_step((None, [truth]), 0)
    return [float(metric.compute()["map"]) for metric in (module.val_map, module.test_map, module.test_map_nms)]


def test_gen1_scores_detections_under_the_rule_that_filtered_its_ground_truth(tmp_path):
    truth = labelled_time(tmp_path)
    # The small car's detection is outside the protocol, as its box is: a perfect score.
    assert scores("gen1", "paper", truth) == pytest.approx([1.0, 1.0, 1.0])


def test_emulated_gen1_and_coco_score_every_detection(tmp_path):
    truth = labelled_time(tmp_path)
    # The small car's detection ranks first and has no box: a false positive before the hit.
    assert scores("gen1", "tiny", truth) == pytest.approx([0.5, 0.5, 0.5])
    assert scores("coco", "paper", truth) == pytest.approx([0.5, 0.5, 0.5])


def test_the_size_rule_is_prophesees_on_arrays_and_tensors():
    rule = BoxSizeFilter(min_diagonal=30.0, min_side=10.0)
    boxes = [[0, 0, 18, 24], [0, 0, 18, 23.9], [0, 0, 40, 9.9], [0, 0, 10, 40], SMALL_CAR, LARGE_CAR]
    expected = [True, False, False, True, False, True]  # diagonal 30 exactly is kept, as diag² >= 30²
    assert rule.keep(np.array(boxes, dtype=np.float32)).tolist() == expected
    assert rule.keep(torch.tensor(boxes)).tolist() == expected


def test_more_detections_per_image_than_coco_counts_is_a_config_error() -> None:
    """pycocotools keeps 100 per image and class, so 150 detections of two classes would all
    be scored: the head's per-image cap may not exceed COCO's 100."""
    from pe_bench.harness.config import ConfigError, load_run_config

    assert load_run_config("coco", "tiny").model.max_detections == 100
    with pytest.raises(ConfigError, match="model.max_detections: Input should be less than or equal to 100"):
        load_run_config("coco", "tiny", {"model": {"max_detections": 150}})
