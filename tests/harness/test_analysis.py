"""PaPE's z-score (pape.txt Eq. 15-16) on a hand-computable case and on a real model."""

from __future__ import annotations

import math

import torch

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.config import ModelConfig
from pe_bench.harness.reports.analysis import head_scores, pape_head_scores, top_attended
from pe_bench.tasks._shared.vit import ViT, image_geometry


def test_z_score_by_hand():
    # P = [[2, 1], [1, 2]], Y = 1: γ = 3, A = [[2/3, 1/3], [1/3, 2/3]].
    positional = torch.tensor([[math.log(2), 0.0], [0.0, math.log(2)]]).reshape(1, 1, 2, 2)
    semantic = torch.zeros(1, 1, 2, 2)
    # τ = 0.5: each query's top set is its diagonal key (2/3 >= 0.5): z = (2 - 1)/3.
    assert torch.allclose(head_scores(semantic, positional, 0.5), torch.tensor([1 / 3]))
    # τ = 1: all keys: mean of (2 - 1)/3 and (1 - 1)/3.
    assert torch.allclose(head_scores(semantic, positional, 1.0), torch.tensor([1 / 6]))
    # Swapping the roles flips the sign: a head driven by content scores negative.
    assert torch.allclose(head_scores(positional, semantic, 0.5), torch.tensor([-1 / 3]))


def test_top_attended_is_the_minimal_set_reaching_tau():
    attn = torch.tensor([[0.5, 0.1, 0.3, 0.1]])
    assert top_attended(attn, 0.8).tolist() == [[True, False, True, False]]
    assert top_attended(attn, 0.81).sum() == 3


def test_scores_for_every_layer_and_head_of_a_pape_vit():
    model = ViT(
        EncodingFactory("pape", {"m": 4}),
        image_geometry((16, 16), 4),
        ModelConfig(dim=32, depth=3, num_heads=4, patch_size=4),
        3,
        5,
    )
    scores = pape_head_scores(model, torch.randn(2, 3, 16, 16))
    assert scores.shape == (3, 4) and torch.isfinite(torch.as_tensor(scores)).all()
    explicit = ViT(EncodingFactory("pape", {"m": 4, "form": "explicit"}), image_geometry((16, 16), 4),
                   ModelConfig(dim=32, depth=3, num_heads=4, patch_size=4), 3, 5)  # fmt: skip
    explicit.load_state_dict(model.state_dict())
    images = torch.randn(2, 3, 16, 16)
    assert torch.allclose(torch.as_tensor(pape_head_scores(model, images)),
                          torch.as_tensor(pape_head_scores(explicit, images)), atol=1e-5)  # fmt: skip
