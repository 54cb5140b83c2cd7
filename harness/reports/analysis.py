"""PaPE model analysis (PaPE Section 5.6, Eq. 15-16, Figure 3).

PaPE: Øhrstrøm et al., "Where to Attend: A Principled Vision-Centric Position Encoding with
Parabolas".

PaPE's logits split into a positional part <a_i, Δr²> + <b_i, Δr> and a semantic part
<q_i, k_j>, so attention factorises as A_ij = P_ij Y_ij / γ_i with P = exp(positional),
Y = exp(semantic), γ_i = Σ_j P_ij Y_ij. The per-head score

    z = E_ij[(P_ij - Y_ij) / γ_i]      over each query's top-attended keys

is positive for heads that lean on positions and negative for heads driven by content. The
top-attended keys of a query are the fewest keys whose cumulative attention reaches τ.
P and Y are taken normalised over each query's keys (see ``head_scores``): attention is the
same, and z no longer blows up (1e11 and more) on logits offset by a constant per query.
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


def head_scores(
    semantic: Tensor, positional: Tensor, tau: float, key_valid: Tensor | None = None, query_valid: Tensor | None = None
) -> Tensor:
    """z per head (Eq. 16) from scaled semantic and positional logits (B, H, Nq, Nk) -> (H,),
    over the keys ``key_valid`` (B, Nk) and the queries ``query_valid`` (B, Nq) (default: all).

    P and Y are each normalised over a query's keys (P̃ = softmax(positional), Ỹ =
    softmax(semantic), γ̃ = Σ_j P̃ Ỹ). Attention is unchanged (A = P̃ Ỹ / γ̃), but z no longer
    depends on a constant added to all logits of a query, which softmax ignores and the model
    is free to learn: semantic logits all near -27 for some query (q_i·k_j of near-zero
    variance over j, far from zero) make the raw Y = exp(q·k) ≈ e^-27, γ as small, and P/γ
    about 5e11 - z-scores of 1e11 to 1e18 on a trained tiny model. Normalised, a query's z
    over all its keys is exactly 0, and the top-attended keys say which factor chose them.
    """
    semantic, positional = semantic.double(), positional.double()
    if key_valid is not None:
        invalid = ~key_valid[:, None, None, :]
        semantic = semantic.masked_fill(invalid, float("-inf"))
        positional = positional.masked_fill(invalid, float("-inf"))
    log_p = positional.logsumexp(-1, keepdim=True)  # log Σ_j P_ij
    log_y = semantic.logsumexp(-1, keepdim=True)  # log Σ_j Y_ij
    log_total = (semantic + positional).logsumexp(-1, keepdim=True)  # log γ_i
    attention = torch.exp(semantic + positional - log_total)
    # (P̃ - Ỹ)/γ̃ in log space, with log γ̃ = log γ - log ΣP - log ΣY: nothing overflows.
    z = torch.exp(positional + log_y - log_total) - torch.exp(semantic + log_p - log_total)
    keep = top_attended(attention, tau)
    if key_valid is not None:
        keep &= key_valid[:, None, None, :]
    if query_valid is not None:
        keep &= query_valid[:, None, :, None]
    z = torch.where(keep, z, torch.zeros_like(z))
    return (z.sum(dim=(0, 2, 3)) / keep.sum(dim=(0, 2, 3)).clamp_min(1)).float()


def _split_logits(attn: Attention, x: Tensor, layout: PositionLayout) -> tuple[Tensor, Tensor]:
    """Scaled semantic (q.k) and positional (the rest of PaPE's widened product) logits."""
    q, k, _ = attn._heads(attn.qkv(x), blocks=3)
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
        positioned = layout.positioned
        rows.append(head_scores(semantic, positional, tau, positioned, positioned).numpy())
    return np.stack(rows)


def head_name(scores: np.ndarray, which: str = "max") -> str:
    """``"L3 H4"`` (counted from 1) for the head with the largest (``"max"``) or smallest z."""
    flat = int(scores.argmax() if which == "max" else scores.argmin())
    layer, head = np.unravel_index(flat, scores.shape)
    return f"L{int(layer) + 1} H{int(head) + 1}"


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
