"""The README's "Stable seeds" claim: a zero-initialised head passes the backbone no gradient
at the first step (dL/dx = W^T (p - y) with W = 0); nn.Linear's default head does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.config import ModelConfig
from pe_bench.tasks._shared.vit import ViT, image_geometry


def first_step_backbone_grad(head_init: str) -> float:
    torch.manual_seed(0)
    config = ModelConfig(dim=32, depth=2, num_heads=2, mlp_ratio=2.0, patch_size=4, head_init=head_init)
    model = ViT(EncodingFactory("pape", {"m": 4}), image_geometry((16, 16), 4), config, 3, 5)
    loss = F.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    backbone = [p for name, p in model.named_parameters() if not name.startswith("head.")]
    assert backbone and all(p.grad is not None for p in backbone)
    return sum(float(p.grad.abs().sum()) for p in backbone)


@pytest.mark.parametrize("head_init", ["zero", "default"])
def test_zero_head_starves_the_backbone_at_the_first_step(head_init: str) -> None:
    total = first_step_backbone_grad(head_init)
    if head_init == "zero":
        assert total == 0.0
    else:
        assert total > 1e-3
