"""``pe-bench bench --sweep``: time and peak memory of one attention layer as the token
count grows. Every point runs in a fresh process, so a point that runs out of memory or meets
a kernel error stays there and is a table entry ("OOM", "error: ..."), not a crash; issue 16
asks the bias encodings to stay linear in memory up to 65,536 tokens on CUDA."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

import pandas as pd
import torch

from pe_bench.adapters import Geometry, PositionLayout
from pe_bench.adapters import build as build_encoding
from pe_bench.harness.attention import Attention, set_attention_kernel, wants_flex
from pe_bench.harness.reports.bench import _autocast, _cuda_peak_mib, _peak_rss_mib, _run_child


def _attention_layer(
    method: str, tokens: int, dim: int, heads: int, device: str = "cpu", kernel: str = "auto"
) -> tuple[Attention, torch.Tensor, PositionLayout]:
    from pe_bench.harness.grid.methods import parse_method

    side = max(int(math.isqrt(tokens)), 1)
    parsed = parse_method(method)
    geometry = Geometry(pos_dim=2, grid_shape=(side, side), num_prefix_tokens=0)
    encoding = build_encoding(parsed.name, geometry, dim, heads, 1, dict(parsed.options)).to(device)
    layer = set_attention_kernel(Attention(dim, heads, encoding.make_layer(0)).eval().to(device), kernel)
    layout = encoding.prepare(PositionLayout.grid(1, (side, side), device=device))
    x = encoding.embed(torch.randn(1, side * side, dim, device=device), layout)
    return layer, x, layout


def _peak_memory_child(
    method: str, tokens: int, dim: int, heads: int, device: str = "cpu", kernel: str = "auto"
) -> dict:
    """Runs in a subprocess: the time and peak memory of one attention layer's forward.

    CPU (fp32, one thread): peak RSS above the bare torch process of building the layer with
    its inputs and running one forward, and that forward's time. CUDA (bf16 autocast): after
    one warm-up forward (FlexAttention compiles its kernel there), the mean time of 5 forwards
    and the allocator's peak during them above what was allocated before (weights and input
    excluded)."""
    if not device.startswith("cuda"):
        torch.set_num_threads(1)
        baseline = _peak_rss_mib()
        with torch.inference_mode():
            layer, x, layout = _attention_layer(method, tokens, dim, heads, kernel=kernel)
            start = time.perf_counter()
            layer(x, layout)
            elapsed = time.perf_counter() - start
        return {"peak_mib": _peak_rss_mib() - baseline, "ms": elapsed * 1000}
    repeats = 5
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed_forwards() -> None:
        start.record()
        for _ in range(repeats):
            layer(x, layout)
        end.record()

    with torch.inference_mode(), _autocast(device):
        layer, x, layout = _attention_layer(method, tokens, dim, heads, device, kernel)
        layer(x, layout)
        peak = _cuda_peak_mib(timed_forwards)
    return {"peak_mib": peak, "ms": start.elapsed_time(end) / repeats}


EXPLICIT_BUDGET = 4 * 2**30

#: ``--sweep``'s encodings: on CPU the bias encodings run their dense bias (the reference
#: path, built in chunks of queries past 2^27 elements: harness/attention.py), slowly; on
#: CUDA they run on FlexAttention, and CoPE, which has no Flex form, on the chunked dense
#: bias: the sweep shows their memory staying linear.
SWEEP_METHODS = {
    "cpu": "nopos,rope,pape,pape[form=explicit]",
    "cuda": "nopos,rope,rope-mixed,pape,alibi,lookhere,relpos,sape2,cope,pape[form=explicit],pape-ri[form=explicit]",
}


def _explicit_pape_bytes(method: str, tokens: int, heads: int) -> float:
    from pe_bench.harness.grid.methods import parse_method

    spec = parse_method(method)
    options = dict(spec.options)
    if spec.name not in ("pape", "pape-ri") or options.get("form") != "explicit":
        return 0.0
    # values per pair: PaPE's m differences, PaPE-RI's one squared distance
    per_pair = options.get("m", 50) if spec.name == "pape" else 1
    return 4.0 * tokens * tokens * heads * (per_pair + 2)


def sweep_table(
    methods: list[str],
    token_counts: list[int],
    dim: int = 768,
    heads: int = 12,
    device: str = "cpu",
    on_row: Callable[[dict], None] | None = None,
    kernel: str = "auto",
) -> pd.DataFrame:
    """Time (ms) and peak memory (MiB) of one attention layer as the token count grows, one
    row per (tokens, method) with its ``status``: "ok", "skipped: ..." or the failure ("OOM",
    "error: ..." with a kernel's message), which is a result here, not a crash. Every point runs
    in a fresh process (see ``_peak_memory_child`` for what is measured per device);
    ``on_row`` sees each row as soon as it is measured; ``kernel`` is the bias encodings'.
    Interrupted (KeyboardInterrupt, e.g. a deadline's SIGINT), it returns the points measured
    so far, with those not measured in ``table.attrs["interrupted"]``."""
    rows: list[dict] = []
    report = on_row or (lambda row: None)
    # whether the bias encodings' points run dense (auto on CUDA counts as Flex here: a
    # dense bias past EXPLICIT_BUDGET is far above auto's small-bias threshold)
    dense = not wants_flex(torch.device(device), kernel)
    points = [(tokens, method) for tokens in token_counts for method in methods]
    interrupted = []
    for index, (tokens, method) in enumerate(points):
        try:
            rows.append(_measure_point(tokens, method, dim, heads, device, kernel, dense))
        except KeyboardInterrupt:  # a deadline: the points measured so far are the table
            interrupted = [f"{method} at {tokens:,} tokens" for tokens, method in points[index:]]
            break
        report(rows[-1])
    table = pd.DataFrame(rows, columns=["tokens", "method", "peak_mib", "ms", "status"])
    table.attrs["interrupted"] = interrupted
    return table


def _measure_point(tokens: int, method: str, dim: int, heads: int, device: str, kernel: str, dense: bool) -> dict:
    """One (tokens, method) row of ``sweep_table``, measured in a fresh process."""
    row: dict[str, object] = {"tokens": tokens, "method": method, "peak_mib": None, "ms": None}
    if dense and _explicit_pape_bytes(method, tokens, heads) > EXPLICIT_BUDGET:
        # The dense Eq. 9 bias holds (B, H, N, N, m) differences: past a few GiB, even built
        # in chunks of queries (harness/attention.py) it takes hours on a CPU; the row shows
        # where the efficient form keeps going. (Flex, CUDA's default kernel, evaluates it
        # per pair inside the kernel: not skipped there.)
        return {**row, "status": f"skipped: dense bias > {EXPLICIT_BUDGET / 2**30:.0f} GiB"}
    code = (
        "import json; from pe_bench.harness.reports.sweep import _peak_memory_child as f;"
        f"print(json.dumps(f({method!r}, {tokens}, {dim}, {heads}, {device!r}, {kernel!r})))"
    )
    result, reason = _run_child(code)
    if result is None:
        return {**row, "status": reason}
    measured = json.loads(result)
    return {**row, "peak_mib": round(measured["peak_mib"], 1), "ms": round(measured["ms"], 2), "status": "ok"}


def sweep_markdown(sweep: pd.DataFrame) -> str:
    """``sweep_table`` as tokens x method, each cell "MiB / ms" or why there is no measurement."""

    def cell(row: pd.Series) -> str:
        if row["status"] != "ok":
            return str(row["status"])
        return f"{row['peak_mib']:,.0f} MiB / {row['ms']:,.1f} ms"

    cells = sweep.assign(cell=sweep.apply(cell, axis=1))
    order = list(dict.fromkeys(sweep["method"]))
    return cells.pivot(index="tokens", columns="method", values="cell")[order].to_markdown()
