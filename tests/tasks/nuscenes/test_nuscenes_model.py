"""The UniTR-style detector: shapes, gradients, where each modality's information flows, the head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_bench.adapters.registry import EncodingFactory
from pe_bench.harness.config import load_run_config
from pe_bench.tasks import get_task
from pe_bench.tasks.nuscenes.data import collate
from pe_bench.tasks.nuscenes.head import CenterTargets
from pe_bench.tasks.nuscenes.synthetic import CLASS_COLOURS, SceneConfig, generate_scene

# Sets that span a whole view / scene: what the tiny profile relies on, made certain here.
WHOLE = {"model": {"unitr": {"camera_set_size": 96, "inter_set_size": 4096}}}


def build(method: str, overrides: dict | None = None):
    task = get_task("nuscenes")(load_run_config("nuscenes", "tiny", overrides or WHOLE))
    torch.manual_seed(0)
    return task, task.build_model(EncodingFactory(method, {"m": 8} if method == "pape" else {}))


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    return collate([generate_scene(SceneConfig(), list(CLASS_COLOURS), (128, 48), rng) for _ in range(2)])


def test_shapes_and_every_parameter_gets_a_gradient(batch):
    task, model = build("pape")
    heatmap, regression = model(batch)
    bev = task.data.grid.shape[:2]  # stride 1: one head cell per voxel column of the BEV map
    assert heatmap.shape == (2, 3, *bev) and regression.shape == (2, 8, *bev)
    model.loss(batch).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
    backbone = model.backbone
    assert backbone.camera_blocks.encoding.geometry.pos_dim == 2
    assert backbone.lidar_blocks.encoding.geometry.pos_dim == 3 == backbone.inter_blocks.encoding.geometry.pos_dim
    assert task.geometry() == backbone.inter_blocks.encoding.geometry


def test_grid_only_encodings_are_not_applicable():
    task, _ = build("nopos")
    assert EncodingFactory("lookhere").unsupported_reason(task.geometry())
    assert EncodingFactory("pape-ri").unsupported_reason(task.geometry()) is None


def shuffled_patches(images: torch.Tensor, patch: int, seed: int) -> torch.Tensor:
    """The same patches at other places of the image."""
    b, v, c, h, w = images.shape
    tiles = images.reshape(b, v, c, h // patch, patch, w // patch, patch).permute(0, 1, 3, 5, 2, 4, 6)
    tiles = tiles.reshape(b, v, -1, c, patch, patch)
    order = torch.randperm(tiles.shape[2], generator=torch.Generator().manual_seed(seed))
    tiles = tiles[:, :, order].reshape(b, v, h // patch, w // patch, c, patch, patch)
    return tiles.permute(0, 1, 4, 2, 5, 3, 6).reshape(b, v, c, h, w)


@torch.no_grad()
def test_only_positions_tell_where_an_image_patch_is(batch):
    """Moving image patches around changes nothing without positions, and something with them."""
    moved = {**batch, "images": shuffled_patches(batch["images"], 8, seed=1)}
    for method, invariant in (("nopos", True), ("rope", False), ("alibi", False), ("pape-ri", False)):
        _, model = build(method)
        model.eval()
        same = torch.allclose(model(batch)[0], model(moved)[0], atol=1e-5)
        assert same == invariant, method


@torch.no_grad()
def test_images_reach_the_detections_only_through_the_inter_modal_blocks(batch):
    other = {**batch, "images": batch["images"].flip(-1)}
    for inter_depth, reaches in ((0, False), (2, True)):
        overrides = {"model": {"depth": 1 + inter_depth, "unitr": {"inter_depth": inter_depth}}}
        _, model = build("rope", overrides)
        model.eval()
        assert torch.allclose(model(batch)[0], model(other)[0], atol=1e-6) != reaches


def test_head_targets_decode_back_to_the_boxes(batch):
    task, _ = build("nopos")
    targets = CenterTargets(task.data.grid, stride=1, min_radius=1)
    encoded = targets.encode(batch["boxes"], batch["labels"], 3)
    heatmap = torch.logit(encoded["heatmap"].clamp(1e-4, 1 - 1e-4))
    regression = torch.zeros(2, 8, *encoded["heatmap"].shape[-2:])
    regression[encoded["sample"], :, encoded["cell"][:, 0], encoded["cell"][:, 1]] = encoded["target"]
    decoded_samples = targets.decode(heatmap, regression, 30)
    for detections, boxes, labels in zip(decoded_samples, batch["boxes"], batch["labels"], strict=True):
        found = detections["scores"] > 0.99
        assert int(found.sum()) == len(boxes)
        order = torch.cdist(boxes[:, :2], detections["centres"][found]).argmin(dim=1)
        decoded = detections["boxes"][found][order]
        assert torch.allclose(decoded[:, :6], boxes[:, :6], atol=1e-4)
        angle = decoded[:, 6] - boxes[:, 6]
        assert torch.allclose(torch.cos(angle), torch.ones_like(angle), atol=1e-5)
        assert torch.equal(detections["labels"][found][order], labels)
