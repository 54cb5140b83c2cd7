"""Batched beam search over any next-token scorer.

``step(tokens)`` gets the (B*K, t) prefixes (bos first; row b*K + k is beam k of sentence b)
and returns (B*K, V) log-probabilities of the next token. Finished beams keep their slot
and score (they are extended by eos at no cost), so beam 1 is exactly greedy decoding.
The final choice divides each score by its length ** length_penalty (fairseq's default
normalisation, lenpen = 1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def beam_search(
    step: Callable[[Tensor], Tensor],
    batch_size: int,
    beam_size: int,
    bos: int,
    eos: int,
    max_new_tokens: Tensor | int,
    length_penalty: float = 1.0,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """Best hypothesis per sentence, as token ids without bos (ending in eos unless cut)."""
    b, k = batch_size, beam_size
    limit = torch.as_tensor(max_new_tokens, device=device).expand(b).long()
    tokens = torch.full((b * k, 1), bos, dtype=torch.long, device=device)
    # Only beam 0 is live at the start; the others would duplicate it.
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    finished = torch.zeros(b, k, dtype=torch.bool, device=device)
    lengths = torch.zeros(b, k, device=device)
    for t in range(int(limit.max())):
        log_probs = step(tokens).float().view(b, k, -1)
        vocab = log_probs.shape[-1]
        eos_only = torch.full_like(log_probs, float("-inf"))
        eos_only[..., eos] = 0.0
        # At the length limit a live hypothesis must end: its eos keeps its model score.
        at_limit = (t >= limit - 1).view(b, 1, 1)
        forced = eos_only.clone()
        forced[..., eos] = log_probs[..., eos]
        log_probs = torch.where(at_limit, forced, log_probs)
        log_probs = torch.where(finished.unsqueeze(-1), eos_only, log_probs)
        candidates = (scores.unsqueeze(-1) + log_probs).view(b, k * vocab)
        scores, index = candidates.topk(k, dim=-1)
        origin, token = index // vocab, index % vocab
        tokens = tokens.view(b, k, -1).gather(1, origin.unsqueeze(-1).expand(-1, -1, t + 1))
        tokens = torch.cat([tokens, token.unsqueeze(-1)], dim=-1).view(b * k, -1)
        was_finished = finished.gather(1, origin)
        lengths = lengths.gather(1, origin) + (~was_finished).float()
        finished = was_finished | (token == eos)
        if bool(finished.all()):
            break
    best = (scores / lengths.clamp_min(1.0) ** length_penalty).argmax(-1)
    chosen = tokens.view(b, k, -1)[torch.arange(b, device=device), best, 1:]
    out = []
    for row in chosen.tolist():
        out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out
