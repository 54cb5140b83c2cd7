"""PaPE model analysis (PaPE Section 5.6, Eq. 15-16, Figure 3).

PaPE: Øhrstrøm et al., "Where to Attend: A Principled Vision-Centric Position Encoding with
Parabolas".

PaPE's logits split into a positional part <a_i, Δr²> + <b_i, Δr> and a semantic part
<q_i, k_j>, so attention factorises as A_ij = P_ij Y_ij / γ_i with P = exp(positional),
Y = exp(semantic), γ_i = Σ_j P_ij Y_ij. The per-head score

    z = E_ij[(P_ij - Y_ij) / γ_i]      over each query's top-attended keys

is positive for heads that lean on positions and negative for heads driven by content. The
top-attended keys of a query are the fewest keys whose cumulative attention reaches τ.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from pe_bench.adapters.base import AttentionInputs, PositionLayout
from pe_bench.adapters.pape import ParabolicLayer

from ..attention import Attention


def top_attended(attention: Tensor, tau: float) -> Tensor:
    """Boolean mask of each row's fewest keys whose cumulative attention reaches ``tau``."""
    sorted_attn, order = attention.sort(dim=-1, descending=True)
    before = sorted_attn.cumsum(-1) - sorted_attn  # attention already collected before this key
    keep_sorted = before < tau - 1e-12
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def head_scores(semantic: Tensor, positional: Tensor, tau: float, key_valid: Tensor | None = None) -> Tensor:
    """z per head (Eq. 16) from scaled semantic and positional logits (B, H, Nq, Nk) -> (H,)."""
    semantic, positional = semantic.double(), positional.double()
    total = semantic + positional
    if key_valid is not None:
        total = total.masked_fill(~key_valid[:, None, None, :], float("-inf"))
    log_gamma = torch.logsumexp(total, dim=-1, keepdim=True)
    attention = torch.exp(total - log_gamma)
    # (P - Y)/γ computed in log space: exp(pos - log γ) - exp(sem - log γ) never overflows.
    z = torch.exp(positional - log_gamma) - torch.exp(semantic - log_gamma)
    keep = top_attended(attention, tau)
    if key_valid is not None:
        keep &= key_valid[:, None, None, :]
    z = torch.where(keep, z, torch.zeros_like(z))
    return (z.sum(dim=(0, 2, 3)) / keep.sum(dim=(0, 2, 3)).clamp_min(1)).float()


def _split_logits(attn: Attention, x: Tensor, layout: PositionLayout) -> tuple[Tensor, Tensor]:
    """Scaled semantic (q.k) and positional (the rest of PaPE's widened product) logits."""
    q, k, _ = (attn._heads(t) for t in attn.qkv(x).chunk(3, dim=-1))
    scale = 1.0 / math.sqrt(attn.head_dim)
    semantic = (q @ k.transpose(-1, -2)) * scale
    inputs = AttentionInputs(x_q=x, x_k=x, query=layout, key=layout)
    layer: ParabolicLayer = attn.encoding  # type: ignore[assignment]
    bias = layer.bias(q, k, inputs)
    if bias is not None:  # explicit form: the bias is already scaled
        return semantic, bias
    q_ext, k_ext = layer.transform_qk(q, k, inputs)
    return semantic, (q_ext @ k_ext.transpose(-1, -2)) * scale - semantic


@torch.inference_mode()
def pape_head_scores(model: torch.nn.Module, batch: Tensor, tau: float = 0.8) -> np.ndarray:
    """(layers, heads) z-scores of every PaPE attention layer of ``model`` on ``batch``."""
    captured: list[tuple[Attention, Tensor, PositionLayout]] = []
    hooks = []
    for module in model.modules():
        if isinstance(module, Attention) and isinstance(module.encoding, ParabolicLayer):
            hook = module.register_forward_pre_hook(lambda mod, args: captured.append((mod, args[0], args[1])))
            hooks.append(hook)
    if not hooks:
        raise ValueError("the model has no PaPE attention layer (train it with --methods pape)")
    try:
        model.eval()(batch)
    finally:
        for hook in hooks:
            hook.remove()
    rows = []
    for attn, x, layout in captured:
        semantic, positional = _split_logits(attn, x, layout)
        # CLS and other position-free tokens have no positional term: keep positioned pairs.
        rows.append(head_scores(semantic, positional, tau, layout.valid).numpy())
    return np.stack(rows)


def plot_heatmap(scores: np.ndarray, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import SymLogNorm

    bound = float(np.abs(scores).max()) or 1.0
    fig, ax = plt.subplots(figsize=(1 + 0.5 * scores.shape[1], 1 + 0.4 * scores.shape[0]))
    # z spans orders of magnitude when P and Y disagree strongly: a symmetric log scale
    # keeps the sign (the point of the figure) readable for small and large heads alike.
    image = ax.imshow(scores, cmap="coolwarm", norm=SymLogNorm(linthresh=0.1, vmin=-bound, vmax=bound))
    ax.set_xticks(range(scores.shape[1]), [f"H{h + 1}" for h in range(scores.shape[1])])
    ax.set_yticks(range(scores.shape[0]), [f"L{i + 1}" for i in range(scores.shape[0])])
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="z (red: positional, blue: semantic)")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=150)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)
