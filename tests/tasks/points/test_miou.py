"""ScanNet's mIoU: classes absent from both prediction and target do not count; ignored points
do not count; accumulated over batches (scenes) before averaging."""

from __future__ import annotations

import pytest
import torch

from pe_bench.tasks.points.module import IGNORE_INDEX, mean_iou


def _reference(preds: torch.Tensor, target: torch.Tensor, num_classes: int) -> float:
    """IoU per class from the confusion matrix, averaged over classes with a non-empty union."""
    keep = target != IGNORE_INDEX
    ious = []
    for c in range(num_classes):
        p, t = preds[keep] == c, target[keep] == c
        union = (p | t).sum().item()
        if union:
            ious.append((p & t).sum().item() / union)
    return sum(ious) / len(ious)


def test_by_hand_with_an_absent_class_and_ignored_points():
    # 4 classes, class 3 in neither prediction nor target: the mean is over classes 0, 1, 2.
    target = torch.tensor([0, 0, 1, 1, 2, IGNORE_INDEX, IGNORE_INDEX])
    preds = torch.tensor([0, 1, 1, 1, 2, 3, 0])  # the ignored points' predictions do not count
    metric = mean_iou(4)
    metric.update(preds, target)
    # IoU: class 0 = 1/2, class 1 = 2/3, class 2 = 1/1
    assert metric.compute().item() == pytest.approx((1 / 2 + 2 / 3 + 1) / 3)


def test_a_class_only_predicted_counts_with_iou_zero():
    metric = mean_iou(3)
    metric.update(torch.tensor([0, 2]), torch.tensor([0, 0]))
    assert metric.compute().item() == pytest.approx((1 / 2 + 0) / 2)  # class 1 absent, class 2 IoU 0


def test_matches_the_confusion_matrix_definition_over_several_scenes():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        num_classes = int(torch.randint(2, 10, (1,), generator=gen))
        used = torch.randperm(num_classes, generator=gen)[: int(torch.randint(1, num_classes + 1, (1,), generator=gen))]
        metric, scenes = mean_iou(num_classes), []
        for _ in range(3):
            n = int(torch.randint(1, 60, (1,), generator=gen))
            target = used[torch.randint(len(used), (n,), generator=gen)]
            target[torch.rand(n, generator=gen) < 0.2] = IGNORE_INDEX
            preds = torch.randint(num_classes, (n,), generator=gen)
            metric.update(preds, target)
            scenes.append((preds, target))
        preds, target = (torch.cat(parts) for parts in zip(*scenes, strict=True))
        if (target != IGNORE_INDEX).any():
            assert metric.compute().item() == pytest.approx(_reference(preds, target, num_classes), abs=1e-6)
