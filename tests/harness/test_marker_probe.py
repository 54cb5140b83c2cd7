"""The tiny-coco marker probe measures what it says (its numbers back a README claim)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.attention import Attention
from pe_bench.harness.reports.marker_probe import linear_probe_accuracy, probe
from pe_bench.tasks.detection.models import DetectionModelConfig, ImageDetector, image_detection_geometry
from pe_bench.tasks.detection.synthetic import SceneSpec, quantised, relation_scene

SPEC = SceneSpec(64, (2, 4), (8, 20), cell=8)
MODEL = DetectionModelConfig(dim=32, depth=2, num_heads=2, mlp_ratio=2.0, patch_size=8, neck_dim=16, reg_max=8)


def _scenes_and_images(count: int):
    rng = np.random.default_rng(0)
    scenes = [relation_scene(rng, SPEC) for _ in range(count)]
    images = torch.stack([torch.from_numpy(quantised(s.image)).permute(2, 0, 1).float() / 255.0 for s in scenes])
    return scenes, images


def test_uniform_attention_reads_one_times_uniform_and_the_mean_pairwise_distance():
    torch.manual_seed(0)
    model = ImageDetector(EncodingFactory("nopos"), image_detection_geometry((64, 64), 8), MODEL, 3, 4)
    for attention in (m for m in model.modules() if isinstance(m, Attention)):
        with torch.no_grad():  # q = k = 0: every logit 0, attention exactly uniform
            attention.qkv.weight[: 2 * 32].zero_()
            attention.qkv.bias[: 2 * 32].zero_()
    scenes, images = _scenes_and_images(12)
    result = probe(model, images, scenes, cell=8, classes=4)
    assert result.objects == sum(len(s.labels) for s in scenes)
    seen = sorted({label for s in scenes for label in s.labels})
    assert result.marker_attention[:, :, seen] == pytest.approx(1.0, abs=1e-5)
    cells = torch.stack(torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij"), -1).reshape(64, 2)
    assert result.attended_distance == pytest.approx(torch.cdist(cells, cells).mean().item(), abs=1e-5)


def test_attention_to_the_marker_is_found_where_the_marker_is():
    """Attention all on the marker reads N times uniform, for every head and layer."""
    torch.manual_seed(0)
    model = ImageDetector(EncodingFactory("nopos"), image_detection_geometry((64, 64), 8), MODEL, 3, 4)
    scenes, images = _scenes_and_images(6)

    def marker_logits(x, layout):  # +100 on each image's marker key, 0 elsewhere
        scores = torch.zeros(x.shape[0], 2, x.shape[1], x.shape[1])
        for i, scene in enumerate(scenes):
            scores[i, :, :, scene.marker[0] * 8 + scene.marker[1]] = 100.0
        return scores

    for module in model.modules():
        if isinstance(module, Attention):
            module.logits = marker_logits
    result = probe(model, images, scenes, cell=8, classes=4)
    seen = sorted({label for s in scenes for label in s.labels})
    assert result.marker_attention[:, :, seen] == pytest.approx(64.0, rel=1e-4)


def test_linear_probe_separates_what_is_separable_and_nothing_else():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (400,), generator=generator)
    centres = torch.randn(4, 16, generator=generator, dtype=torch.float64) * 3
    separable = centres[labels] + torch.randn(400, 16, generator=generator, dtype=torch.float64)
    assert linear_probe_accuracy(separable, labels, 4) > 0.95
    noise = torch.randn(400, 16, generator=generator, dtype=torch.float64)
    assert linear_probe_accuracy(noise, labels, 4) < 0.45
