"""UniViT training (a random resolution per batch) and resize test-time augmentation (CAPE §5.1)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from pe_bench.harness.cli import main
from pe_bench.harness.config import ConfigError, load_run_config, parse_overrides
from pe_bench.harness.grid import store
from pe_bench.tasks.base import get_task
from pe_bench.tasks.image.resolution import (
    ComposeBatch,
    RandomBatchResolution,
    ResizeTTA,
    check_sides,
    resize_batch,
)


class SideLogits(nn.Module):
    """Logits that reveal the input side: (B, 2) filled with [side, side²]."""

    def forward(self, images):
        side = float(images.shape[-1])
        return torch.tensor([side, side**2]).expand(images.shape[0], 2)


def test_resize_batch_shape_and_identity_at_the_same_size():
    images = torch.randn(2, 3, 24, 24)
    assert resize_batch(images, 24) is images
    assert resize_batch(images, 32).shape == (2, 3, 32, 32)
    constant = torch.full((1, 3, 24, 24), 0.7)
    assert torch.allclose(resize_batch(constant, 16), torch.full((1, 3, 16, 16), 0.7), atol=1e-5)


def test_tta_averages_logits_over_three_sides():
    tta = ResizeTTA(8)
    assert tta.sides(24) == [16, 24, 32]
    logits = tta(SideLogits(), torch.zeros(3, 3, 24, 24))
    assert logits.shape == (3, 2)
    # mean side is r; mean squared side is r² + 2δ²/3, so all three sizes were evaluated
    assert torch.allclose(logits[0], torch.tensor([24.0, (16**2 + 24**2 + 32**2) / 3]))


def test_random_batch_resolution_draws_every_side_and_is_seeded():
    sampler = RandomBatchResolution([16, 24, 32])
    labels = torch.arange(4)

    def draws(seed):
        torch.manual_seed(seed)
        return [sampler(torch.zeros(4, 3, 24, 24), labels)[0].shape[-1] for _ in range(60)]

    first = draws(0)
    assert set(first) == {16, 24, 32}
    assert draws(0) == first
    assert all(out is labels for out in [sampler(torch.zeros(1, 3, 24, 24), labels)[1]])


def test_compose_skips_missing_transforms_and_keeps_order():
    calls = []

    def tag(name):
        def transform(images, labels):
            calls.append(name)
            return images + 1, labels

        return transform

    images, _ = ComposeBatch(tag("a"), None, tag("b"))(torch.zeros(1), torch.zeros(1))
    assert calls == ["a", "b"] and images.item() == 2


def test_sides_that_split_patches_are_config_errors():
    check_sides([16, 24], 4, "data.train_sides")
    with pytest.raises(ConfigError, match=r"data.train_sides: sides \[17\].*patch size 4.*\[16\]"):
        check_sides([16, 17], 4, "data.train_sides")
    config = load_run_config("imagenet", "tiny", parse_overrides(["data.tta_delta=3"]))
    with pytest.raises(ConfigError, match="imagenet/tiny: data.tta_delta"):
        get_task("imagenet")(config)


def test_univit_cell_trains_on_several_grids_and_reports_accuracy_with_and_without_tta(tmp_path, monkeypatch):
    from pe_bench.tasks._shared.vit import ViT

    seen = set()
    forward = ViT.forward

    def recording_forward(self, images):
        if self.training:
            seen.add(images.shape[-1])
        return forward(self, images)

    monkeypatch.setattr(ViT, "forward", recording_forward)
    small = ["optim.epochs=2", "data.train_size=256", "data.val_size=32", "data.test_size=64", "model.dim=32",
             "model.depth=1", "optim.batch_size=16", "data.train_sides=[16,24,32]", "data.tta_delta=4"]  # fmt: skip
    argv = ["run", "--tasks", "imagenet", "--methods", "sincos", "--out", str(tmp_path)]
    assert main(argv + [arg for override in small for arg in ("--set", override)]) == 0
    assert seen == {16, 24, 32}
    record = json.loads((store.cell_dir(tmp_path, "imagenet", "sincos", 0) / "result.json").read_text())
    assert record["status"] == "ok"
    assert 0 <= record["extra"]["test_acc_without_tta"] <= 100
