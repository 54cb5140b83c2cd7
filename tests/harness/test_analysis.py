"""PaPE's z-score (pape.txt Eq. 15-16) on a hand-computable case and on a real model."""

from __future__ import annotations

import math

import numpy as np
import torch

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.config import ModelConfig
from pe_bench.harness.reports.analysis import head_name, head_scores, pape_head_scores, top_attended
from pe_bench.tasks._shared.vit import ViT, image_geometry


def test_z_score_by_hand():
    # P = [[2, 1], [1, 2]], Y = 1: γ = 3, A = [[2/3, 1/3], [1/3, 2/3]].
    positional = torch.tensor([[math.log(2), 0.0], [0.0, math.log(2)]]).reshape(1, 1, 2, 2)
    semantic = torch.zeros(1, 1, 2, 2)
    # τ = 0.5: each query's top set is its diagonal key (2/3 >= 0.5): z = (2 - 1)/3.
    assert torch.allclose(head_scores(semantic, positional, 0.5), torch.tensor([1 / 3]))
    # τ = 1: all keys. With P and Y normalised per query (P̃ = [2/3, 1/3], Ỹ = [1/2, 1/2],
    # γ̃ = 1/2) a query's z over all its keys is 0: (1/6 + -1/6) / 2.
    assert torch.allclose(head_scores(semantic, positional, 1.0), torch.tensor([0.0]), atol=1e-7)
    # Swapping the roles flips the sign: a head driven by content scores negative.
    assert torch.allclose(head_scores(positional, semantic, 0.5), torch.tensor([-1 / 3]))


def test_z_ignores_constant_logits_per_query_that_softmax_ignores():
    # Semantic logits of (near) zero variance over the keys, far below zero: the raw Y = exp(q·k)
    # is e^-30, and so was γ, which made (P - Y)/γ about 1e13 (seen: 4.7e11 on a trained model).
    positional = torch.tensor([[math.log(2), 0.0], [0.0, math.log(2)]]).reshape(1, 1, 2, 2)
    flat = torch.full((1, 1, 2, 2), -30.0) + 1e-9 * torch.randn(1, 1, 2, 2)
    z = head_scores(flat, positional, 0.5)
    assert torch.allclose(z, torch.tensor([1 / 3]), atol=1e-6)  # as with semantic logits of 0
    shifted = positional + torch.tensor([25.0, -40.0]).reshape(1, 1, 2, 1)  # another constant per query
    assert torch.allclose(head_scores(flat, shifted, 0.5), z, atol=1e-6)


def test_z_only_over_the_given_queries_and_keys():
    # A third token without position (a CLS token) with strong semantic logits changes nothing.
    positional = torch.tensor([[math.log(2), 0.0, 0.0], [0.0, math.log(2), 0.0], [0.0, 0.0, 0.0]]).reshape(1, 1, 3, 3)
    semantic = torch.zeros(1, 1, 3, 3)
    semantic[..., 2] = 9.0
    positioned = torch.tensor([[True, True, False]])
    assert torch.allclose(head_scores(semantic, positional, 0.5, positioned, positioned), torch.tensor([1 / 3]))


def test_head_names_are_plain_and_counted_from_one():
    scores = np.array([[0.5, -3.0], [2.0, 1.0]])
    assert head_name(scores, "max") == "L2 H1" and head_name(scores, "min") == "L1 H2"


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
