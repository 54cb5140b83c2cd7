"""Detection model parts: pyramid, dual head, DFL, task-aligned assigner, loss, read-out, event map."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.adapters import EncodingFactory
from pe_bench.tasks.detection.assigner import Targets, TaskAlignedAssigner
from pe_bench.tasks.detection.head import (
    BranchOutput,
    DualHead,
    anchor_points,
    boxes_to_distances,
    distances_to_boxes,
    distribution_focal_loss,
)
from pe_bench.tasks.detection.loss import DetectionLoss, one_to_many_detections, one_to_one_detections
from pe_bench.tasks.detection.models import (
    DetectionModelConfig,
    Detector,
    ImageDetector,
    image_detection_geometry,
    latest_token_map,
)
from pe_bench.tasks.detection.pyramid import SimpleFeaturePyramid

SMALL = DetectionModelConfig(dim=32, depth=1, num_heads=2, mlp_ratio=2.0, patch_size=8, neck_dim=16, reg_max=8)


def test_pyramid_gives_strides_half_one_and_two_of_the_backbone_map():
    maps = SimpleFeaturePyramid(32, 16)(torch.randn(2, 32, 6, 4))
    assert [tuple(m.shape) for m in maps] == [(2, 16, 12, 8), (2, 16, 6, 4), (2, 16, 3, 2)]


def test_anchor_points_are_cell_centres_in_pixels_level_by_level():
    points, strides = anchor_points([(1, 2), (1, 1)], [4.0, 8.0], torch.device("cpu"))
    assert points.tolist() == [[2.0, 2.0], [6.0, 2.0], [4.0, 4.0]]
    assert strides.tolist() == [4.0, 4.0, 8.0]


def test_box_distance_round_trip():
    points = torch.tensor([[10.0, 20.0], [5.0, 5.0]])
    boxes = torch.tensor([[4.0, 12.0, 30.0, 21.0], [0.0, 1.0, 9.0, 8.0]])
    distances = boxes_to_distances(boxes, points)
    assert distances.tolist() == [[6.0, 8.0, 20.0, 1.0], [5.0, 4.0, 4.0, 3.0]]
    torch.testing.assert_close(distances_to_boxes(distances, points), boxes)


def test_dual_head_shapes_and_both_heads_get_gradients():
    head = DualHead(16, (4.0, 8.0, 16.0), num_classes=3, reg_max=8)
    features = [torch.randn(2, 16, s, s, requires_grad=True) for s in (8, 4, 2)]
    out = head(features)
    assert out.points.shape == (84, 2) and out.strides.shape == (84,)
    for branch in (out.one_to_many, out.one_to_one):
        assert branch.class_logits.shape == (2, 84, 3)
        assert branch.box_logits.shape == (2, 84, 4, 8) and branch.boxes.shape == (2, 84, 4)
        # Decoded boxes contain their anchor point (distances are expectations of bins >= 0).
        assert (branch.boxes[..., :2] <= out.points).all() and (branch.boxes[..., 2:] >= out.points).all()
    sum(b.boxes.sum() + b.class_logits.sum() for b in (out.one_to_many, out.one_to_one)).backward()
    grads = {name: p.grad for name, p in head.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert all(g.abs().sum() > 0 for g in grads.values())
    assert all(f.grad is not None and f.grad.abs().sum() > 0 for f in features)
    # Classification starts at the RetinaNet prior of 1%.
    assert torch.sigmoid(out.one_to_one.class_logits).mean().item() == pytest.approx(0.01, rel=0.5)


def test_distribution_focal_loss_is_smallest_at_the_two_bin_split_of_the_target():
    target = torch.tensor([[2.3, 0.0, 5.5, 6.98]])
    best = torch.full((1, 4, 8), -30.0)
    for side, value in enumerate(target[0].tolist()):
        left = int(value)
        best[0, side, left] = math.log(left + 1 - value + 1e-12)
        best[0, side, left + 1] = math.log(value - left + 1e-12)
    at_best = distribution_focal_loss(best, target)
    entropy = -sum(p * math.log(p) for v in target[0].tolist() for p in (int(v) + 1 - v, v - int(v)) if p > 0) / 4
    assert at_best.item() == pytest.approx(entropy, abs=1e-4)
    assert (distribution_focal_loss(best + 0.5 * torch.randn(1, 4, 8), target) > at_best).all()


def _assigner_case():
    """Two boxes, five points: points 0-2 inside box A, points 3-4 inside box B, point 2 also in B."""
    points = torch.tensor([[1.0, 1.0], [2.0, 2.0], [5.0, 5.0], [7.0, 7.0], [8.0, 8.0]])
    targets = Targets(
        boxes=torch.tensor([[[0.0, 0.0, 6.0, 6.0], [4.0, 4.0, 10.0, 10.0], [0.0, 0.0, 0.0, 0.0]]]),
        labels=torch.tensor([[1, 0, 0]]),
        valid=torch.tensor([[True, True, False]]),
    )
    scores = torch.full((1, 5, 2), 0.1)
    scores[0, 1, 1] = 0.9  # point 1 is sure it sees class 1 (box A)
    # Predictions: point 1 and 2 predict box A exactly; point 3 predicts box B; 0 and 4 are poor.
    boxes = torch.tensor([[[0.0, 0, 2, 2], [0, 0, 6, 6], [0, 0, 6, 6], [4, 4, 10, 10], [7, 7, 9, 9]]])
    return scores, boxes, points, targets


def test_task_aligned_assigner_top1_takes_each_boxs_best_aligned_point():
    scores, boxes, points, targets = _assigner_case()
    result = TaskAlignedAssigner(topk=1)(scores, boxes, points, targets)
    # Box A: point 1 (score 0.9, IoU 1) beats point 2 (0.1, IoU 1); box B: point 3 (IoU 1).
    assert result.foreground[0].tolist() == [False, True, False, True, False]
    assert result.target_boxes[0, 1].tolist() == [0.0, 0.0, 6.0, 6.0]
    assert result.target_boxes[0, 3].tolist() == [4.0, 4.0, 10.0, 10.0]
    # Soft labels at the box's class, scaled so that each box's best point gets its best IoU (1).
    assert result.target_scores[0, 1].tolist() == pytest.approx([0.0, 1.0])
    assert result.target_scores[0, 3].tolist() == pytest.approx([1.0, 0.0])
    assert result.target_scores[0, [0, 2, 4]].abs().sum() == 0


def test_task_aligned_assigner_topk_keeps_inside_points_and_resolves_conflicts_by_iou():
    scores, boxes, points, targets = _assigner_case()
    result = TaskAlignedAssigner(topk=3)(scores, boxes, points, targets)
    assert result.foreground[0].tolist() == [True, True, True, True, True]
    # Point 2 lies in both boxes; its prediction is box A exactly, so it goes to A (class 1).
    assert result.target_boxes[0, 2].tolist() == [0.0, 0.0, 6.0, 6.0]
    assert result.target_scores[0, 2, 1] > 0 and result.target_scores[0, 2, 0] == 0
    # Normalised alignment: the best point of each box gets its best IoU, the others less.
    assert result.target_scores[0, 1, 1].item() == pytest.approx(1.0)
    assert 0 < result.target_scores[0, 0, 1] < result.target_scores[0, 1, 1]


def test_assigner_ignores_padding_boxes_and_images_without_boxes():
    scores, boxes, points, _ = _assigner_case()
    empty = Targets.pad([{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)}])
    result = TaskAlignedAssigner(topk=3)(scores, boxes, points, empty)
    assert not result.foreground.any() and result.target_scores.sum() == 0


def _tiny_detector(method: str = "rope") -> ImageDetector:
    geometry = image_detection_geometry((32, 32), 8)
    return ImageDetector(EncodingFactory(method), geometry, SMALL, in_channels=3, num_classes=3)


def test_loss_decreases_on_a_fixed_batch():
    torch.manual_seed(0)
    model = _tiny_detector()
    images = torch.randn(4, 3, 32, 32)
    targets = Targets.pad(
        [{"boxes": torch.tensor([[2.0, 3.0, 14.0, 12.0], [18.0, 16.0, 30.0, 31.0]]), "labels": torch.tensor([0, 2])}]
        * 2
        + [{"boxes": torch.tensor([[8.0, 8.0, 24.0, 20.0]]), "labels": torch.tensor([1])}] * 2
    )
    loss_fn = DetectionLoss(reg_max=SMALL.reg_max)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss, parts = loss_fn(model(images), targets)
        assert set(parts) == {f"{h}_{p}" for h in ("o2m", "o2o") for p in ("box", "cls", "dfl")}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_one_to_one_readout_takes_the_top_point_class_pairs():
    logits = torch.full((1, 3, 2), -5.0)
    logits[0, 2, 1], logits[0, 0, 0] = 4.0, 2.0
    boxes = torch.tensor([[[0.0, 0, 1, 1], [0, 0, 2, 2], [0, 0, 3, 3]]])
    branch = BranchOutput(logits, torch.zeros(1, 3, 4, 8), boxes)
    (d,) = one_to_one_detections(branch, max_detections=2)
    assert d["labels"].tolist() == [1, 0] and d["boxes"].tolist() == [[0, 0, 3, 3], [0, 0, 1, 1]]
    assert d["scores"][0] == pytest.approx(torch.sigmoid(torch.tensor(4.0)).item())


def test_one_to_many_readout_suppresses_duplicates_per_class():
    logits = torch.full((1, 3, 2), -9.0)
    logits[0, 0, 0], logits[0, 1, 0], logits[0, 1, 1] = 3.0, 2.0, 1.0
    # Points 0 and 1 predict nearly the same box: class 0 keeps one, class 1 its own.
    boxes = torch.tensor([[[0.0, 0, 10, 10], [0, 0, 10, 11], [20, 20, 30, 30]]])
    (d,) = one_to_many_detections(BranchOutput(logits, torch.zeros(1, 3, 4, 8), boxes), max_detections=10)
    assert sorted(zip(d["labels"].tolist(), d["scores"].gt(0.5).tolist(), strict=True)) == [(0, True), (1, True)]


def test_latest_token_map_keeps_the_most_recent_valid_token_of_each_cell():
    tokens = torch.arange(1.0, 6.0)[None, :, None].expand(1, 5, 2).clone()  # token i has value i + 1
    # (x, y, t): tokens 0 and 2 share cell (0, 0), token 2 later; token 3 is later still but padding.
    coords = torch.tensor([[[0, 0, 5.0], [1, 0, 1.0], [0, 0, 7.0], [0, 0, 9.0], [1, 1, 2.0]]])
    valid = torch.tensor([[True, True, True, False, True]])
    grid = latest_token_map(tokens, coords, valid, rows=2, cols=2, empty=torch.tensor([-1.0, -1.0]))
    assert grid[0, 0].tolist() == [[3.0, 2.0], [-1.0, 5.0]]


def _level_maps(logits: torch.Tensor, shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """(B, A, C) per-point outputs -> one (B, C, h, w) map per level."""
    maps, start = [], 0
    for h, w in shapes:
        maps.append(logits[:, start : start + h * w].transpose(1, 2).reshape(logits.shape[0], -1, h, w))
        start += h * w
    return maps


@pytest.mark.parametrize("kernel", [1, 3])
def test_pointwise_class_path_relates_no_cells_while_the_box_branch_sees_neighbours(kernel):
    """With neck_kernel = class_kernel = 1 (the tiny coco), a change of one backbone cell moves
    the class scores only of the points that cell resamples to (its 2x2 children at stride s/2,
    itself at s, its parent at 2s): every relation between positions must come from the encoding.
    With the paper's 3x3 kernels the detector relates neighbouring cells by itself."""
    torch.manual_seed(0)
    model = DetectionModelConfig(
        dim=16, depth=1, num_heads=2, mlp_ratio=2.0, patch_size=8, neck_dim=8, reg_max=4,
        neck_kernel=kernel, class_kernel=kernel,
    )  # fmt: skip
    detector = Detector(16, 8, model, num_classes=3).eval()
    x = torch.randn(1, 16, 8, 8)
    moved = x.clone()
    moved[0, :, 3, 5] += 5.0
    with torch.no_grad():
        before, after = detector(x), detector(moved)
    shapes = [(16, 16), (8, 8), (4, 4)]
    changed = [(a - b).abs().amax(1)[0] > 1e-6 for a, b in zip(
        _level_maps(after.one_to_one.class_logits, shapes), _level_maps(before.one_to_one.class_logits, shapes),
        strict=True)]  # fmt: skip
    expected = [torch.zeros(s, dtype=torch.bool) for s in shapes]
    expected[0][6:8, 10:12] = True  # the deconvolution's 2x2 children
    expected[1][3, 5] = True
    expected[2][1, 2] = True  # the max-pool's parent
    if kernel == 1:
        for got, want in zip(changed, expected, strict=True):
            assert torch.equal(got, want)
    else:
        assert all(got.sum() > want.sum() for got, want in zip(changed, expected, strict=True))
    box_changed = (after.one_to_one.box_logits - before.one_to_one.box_logits).abs().flatten(2).amax(2)[0] > 1e-6
    assert box_changed[256 : 256 + 64].view(8, 8).sum() > 1  # the 3x3 box branch sees neighbours either way


def test_register_tokens_join_the_attention_and_leave_before_the_pyramid():
    torch.manual_seed(0)
    geometry = image_detection_geometry((32, 32), 8, registers=2)
    assert geometry.num_prefix_tokens == 2
    model = ImageDetector(EncodingFactory("pape", {"m": 4}), geometry, SMALL, in_channels=3, num_classes=3)
    plain = _tiny_detector("pape")
    images = torch.randn(2, 3, 32, 32)
    out = model(images)
    assert out.one_to_many.class_logits.shape == plain(images).one_to_many.class_logits.shape
    out.one_to_many.class_logits.sum().backward()
    assert model.registers.grad is not None and model.registers.grad.abs().sum() > 0  # they were attended
    assert plain.registers is None  # no registers, no parameter: older checkpoints keep their keys
