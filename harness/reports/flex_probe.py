"""``pe-bench bench --flex-probe N``: where a bias encoding's FlexAttention time goes, for one
attention layer's call at N tokens.

On an H200 (11-27) one ALiBi layer at 65,536 tokens took 2,407 ms on Flex against nopos's
28 ms on SDPA (86x), and 4x the 602 ms of issue 16's hand-written Flex ALiBi (on an H100);
the sweep times the whole layer and cannot say which part of the call costs it. The probe
captures the exact call the attention core makes (q, k, v, score_mod, block mask and scale,
from one forward of the encoding's layer with ``attention_kernel: flex``) and times it beside
variants that each take one difference away:

* ``sdpa``: SDPA without a bias on the same q, k, v, the fused kernel nopos runs (the floor);
* ``flex, no score_mod``: FlexAttention's own cost;
* ``flex, hand ALiBi``: a minimal ALiBi score_mod (grid coordinates and head slopes, nothing
  else), the kind issue 16 timed;
* ``flex, pe-bench``: the captured call (for several methods, one row each).

Each runs on q, k, v as the core passes them (strided views of the qkv projection, heads
interleaved per token) and on contiguous copies. Measured on this CPU (torch 2.14, Inductor's
CPU Flex template, 4,096 tokens; benchmarks/cpu-flex-probe-2026-11-28): the captured ALiBi call
took 2.8x as long on the strided inputs as on contiguous ones (3,284 against 1,165 ms).
Every Flex variant is compiled as the core compiles Flex on CUDA (``_flex``), on the CPU too,
where the core itself runs Flex eagerly. A column gives each output's largest difference
from the captured call's, so a variant that computes another function is visible as such
(no score_mod differs by design; hand ALiBi equals pe-bench's alibi on a grid).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from pe_bench.adapters import PositionLayout
from pe_bench.adapters.alibi import alibi_slopes

#: the layer the sweep measures: ViT-B's width
PROBE_DIM, PROBE_HEADS = 768, 12


@dataclass
class FlexCall:
    """The arguments the attention core passed to ``run_flex`` in one forward."""

    q: Tensor
    k: Tensor
    v: Tensor
    score_mod: Callable | None
    block_mask: object
    scale: float | None


def capture_flex_call(
    method: str, tokens: int, device: str, dim: int = PROBE_DIM, heads: int = PROBE_HEADS
) -> FlexCall:
    """One forward of ``method``'s attention layer at ``tokens`` grid tokens, bf16 autocast on
    CUDA, with its Flex call recorded instead of run."""
    from pe_bench.harness import attention
    from pe_bench.harness.reports.bench import _autocast
    from pe_bench.harness.reports.sweep import _attention_layer

    calls: list[FlexCall] = []

    def record(q, k, v, score_mod=None, block_mask=None, scale=None, return_lse=False):
        calls.append(FlexCall(q, k, v, score_mod, block_mask, scale))
        return q.new_zeros(*q.shape[:-1], v.shape[-1])  # not run here: the probe times it

    real = attention.run_flex
    attention.run_flex = record
    try:
        with torch.inference_mode(), _autocast(device):
            layer, x, layout = _attention_layer(method, tokens, dim, heads, device, kernel="flex")
            layer(x, layout)
    finally:
        attention.run_flex = real
    if len(calls) != 1:
        raise ValueError(
            f"--flex-probe {method}: its layer made {len(calls)} FlexAttention calls, expected 1"
            " (an encoding with a score_mod: alibi, lookhere, relpos, pape[form=explicit], ...)"
        )
    return calls[0]


def _hand_alibi(tokens: int, heads: int, device: torch.device) -> Callable:
    """ALiBi's score_mod with nothing but the grid's coordinates and the head slopes."""
    side = math.isqrt(tokens)
    # the grid the captured layer sees (sweep._attention_layer: no prefix tokens), one
    # contiguous tensor per axis, as a hand-written score_mod would hold them
    y, x = PositionLayout.grid(1, (side, side), device=device).coords[0].T.contiguous()
    slopes = alibi_slopes(heads).to(device)

    def hand_alibi(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        dy, dx = y[j] - y[i], x[j] - x[i]
        return score - slopes[h] * (dy * dy + dx * dx).sqrt()

    return hand_alibi


def _timed(call: Callable[[], Tensor], device: str, repeats: int) -> tuple[Tensor, float, float]:
    """The first call's output and seconds (compilation included), and the median ms of
    ``repeats`` more calls."""

    def once() -> tuple[Tensor, float]:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = call()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return out, time.perf_counter() - start

    out, first = once()
    return out, first, statistics.median(once()[1] for _ in range(repeats)) * 1000


def flex_probe_table(
    methods: list[str], tokens: int, device: str, repeats: int = 5, dim: int = PROBE_DIM, heads: int = PROBE_HEADS
) -> pd.DataFrame:
    """The probe's rows (module doc): variant, layout, median ms, ratio to SDPA's, the first
    call's seconds (compilation), and the output's largest difference from the first
    method's captured call."""
    from pe_bench.adapters._flex import _compiled_flex_attention

    if math.isqrt(tokens) ** 2 != tokens:
        raise ValueError(
            f"--flex-probe {tokens}: the probe's grid is square; give a square token count (e.g. 4096, 16384, 65536)"
        )
    flex = _compiled_flex_attention()
    captured = {method: capture_flex_call(method, tokens, device, dim, heads) for method in methods}
    base = captured[methods[0]]
    layouts = {
        "strided (as the core passes them)": (base.q, base.k, base.v),
        "contiguous": tuple(t.contiguous() for t in (base.q, base.k, base.v)),
    }
    hand_alibi = _hand_alibi(tokens, heads, base.q.device)  # built once, outside the timed calls
    rows = []
    reference: Tensor | None = None
    with torch.inference_mode():
        for layout, (q, k, v) in layouts.items():
            variants: list[tuple[str, Callable[[], Tensor]]] = [
                ("sdpa (no bias)", lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, scale=base.scale)),
                ("flex, no score_mod", lambda q=q, k=k, v=v: flex(q, k, v, scale=base.scale)),
                ("flex, hand ALiBi", lambda q=q, k=k, v=v: flex(q, k, v, score_mod=hand_alibi, scale=base.scale)),
            ]
            for method, call in captured.items():
                variants.append(
                    (
                        f"flex, pe-bench {method}",
                        lambda q=q, k=k, v=v, c=call: flex(
                            q, k, v, score_mod=c.score_mod, block_mask=c.block_mask, scale=c.scale
                        ),
                    )
                )
            for variant, run in variants:
                out, first_s, ms = _timed(run, device, repeats)
                out = out[..., : base.v.shape[-1]].float()
                if reference is None and variant == f"flex, pe-bench {methods[0]}":
                    reference = out
                rows.append({"variant": variant, "layout": layout, "ms": ms, "first_call_s": first_s, "out": out})
    sdpa_ms = {row["layout"]: row["ms"] for row in rows if row["variant"] == "sdpa (no bias)"}
    for row in rows:
        row["x_sdpa"] = row["ms"] / sdpa_ms[row["layout"]]
        row["max_diff_vs_pe_bench"] = (row.pop("out") - reference).abs().max().item()
    return pd.DataFrame(rows, columns=["variant", "layout", "ms", "x_sdpa", "first_call_s", "max_diff_vs_pe_bench"])
