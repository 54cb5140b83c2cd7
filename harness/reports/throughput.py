"""``pe-bench bench --throughput``: img/s per encoding (training and inference; bf16 autocast
on CUDA), how many times slower than nopos, timed in pairs with nopos calls (``paired.py``),
and that over the encoding's FLOP-model bound: the figures of issue 16's GPU table."""

from __future__ import annotations

import gc
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from pe_bench.adapters._string import basis_folded
from pe_bench.adapters.pape import PaPEOptions, feature_widths, in_position_space
from pe_bench.harness.config import ModelConfig
from pe_bench.harness.reports.bench import (
    MODELS,
    TIMM_MODELS,
    TIMM_ROW,
    BenchSpec,
    _build_vit,
    _inference,
    _TrainStep,
    compile_for_bench,
    failure_cell,
    sdpa_backend,
)
from pe_bench.harness.reports.compiled_attention import recording
from pe_bench.harness.reports.paired import PairedTiming, paired_timing, time_call

#: real FLOPs of one lattice term of WePE's truncated sums, per token (adapters/wepe.py's
#: ``weierstrass``): the complex difference (2), its modulus and the pole test (4), the
#: reciprocal (7), its square and cube (6 + 6), and the two sums (2 + 2); an estimate of
#: elementwise work, as the other encodings' elementwise terms are.
WEPE_FLOPS_PER_TERM = 29

#: the encodings of the GPU table (issue 16), nopos first.
THROUGHPUT_METHODS = (
    "nopos", "sincos", "abspos", "cape", "rope", "rope-mixed", "string-cayley", "string-circulant",
    "wepe", "alibi", "relpos", "lookhere", "cope", "sape2", "pape", "pape[space=projected]", "pape[low_precision=bias]",
    "pape[m=8]", "pape-ri",
    "pape-ri[low_precision=bias]", "pape[form=explicit]",
)  # fmt: skip


def vit_forward_flops(config: ModelConfig, tokens: int, patch_dim: int, num_classes: int = 1000) -> float:
    """Forward FLOPs (multiply-add = 2) of one image through a ViT without position encoding:
    per layer the qkv/proj/MLP matmuls, N D^2 (8 + 4 mlp_ratio), and the attention's two
    N x N products, 4 N^2 D; plus the patch embedding and the head."""
    n, d = tokens, config.dim
    per_layer = n * d * d * (8 + 4 * config.mlp_ratio) + 4 * n * n * d
    return config.depth * per_layer + 2 * (n - 1) * patch_dim * d + 2 * d * num_classes


def _widened_channels(extra: int, pad_to: int, split: bool) -> int:
    """Extra q/k channels of PaPE's efficient forms after the hi/lo split and padding."""
    width = 3 * extra if split else extra
    return width + (-width % pad_to)


def _widened_flops(extra: int, options: dict, pairs: int, bf16: bool, v_padded: bool) -> float:
    """FLOPs of PaPE's (or PaPE-RI's) ``extra`` positional channels over ``pairs`` (query, key)
    pairs: in q.k, widened (split 3x in bf16 and padded), or with ``low_precision: bias`` in
    bf16 as a float32-accurate product of six bf16 piece products per channel
    (adapters/_float32_product.py: 12 per channel and pair, unpadded) plus the bias's add.
    ``v_padded`` (off CUDA): the CPU kernels take v as wide as q and k, so P.V runs over the
    widened channels too (until stop 61 left out: CPU bounds 3 % low at ViT-B, 18 % on tiny)."""
    low_precision = options.get("low_precision", "split")
    if bf16 and low_precision == "bias":
        return pairs * (12.0 * extra + 1)
    split = bf16 and low_precision == "split"
    return pairs * 2.0 * _widened_channels(extra, int(options.get("pad_to", 8)), split) * (2 if v_padded else 1)


def encoding_flops(
    method: str, config: ModelConfig, tokens: int, pos_dim: int = 2, bf16: bool = True, device: str = "cuda"
) -> float | None:
    """Forward FLOPs per image that ``method`` adds to a ViT (``vit_forward_flops``) on
    ``device``, by the encoding's action point; None for an encoding the model does not know.

    * embed (sincos, abspos, cape): one add per token channel, N D (plus CAPE/sincos
      features, a few per channel): 4 N D. WePE: its Linear(4 -> D), 8 N D, until stop 64
      left out (the model counted 4 N D, half the matrix product alone), gamma and the add,
      and the Weierstrass sums per token, about 27 per lattice term (``num_terms``, 120).
    * rotation of q and k (rope, rope-mixed, STRING) per layer: 3 per q/k channel (pairs:
      4 multiplies, 2 adds) on 2 N D channels, plus angles and cos/sin, ~ 2 N D: 8 N D.
      Both STRINGs add a basis change on q and k. Applied per token (``basis: per_token``,
      and ``auto`` off CUDA) it is an (E x E) product per token and head: 4 N D E (Cayley's
      learned P; Circulant's fixed real Fourier basis, dense, whose block-diagonal zeros
      the matrix product multiplies too). Folded into the projections (``folded``, and
      ``auto`` on CUDA) it is 4 H E^2 D per layer and forward, shared by the batch: left
      out (at batch 128 under 0.1 % of a layer's FLOPs).
    * bias per layer, per head and (query, key) pair: ALiBi 3P + 3 (differences, squares,
      sqrt, slope), relpos 4P + 2 (round, clip, index), LookHere 3P + 8 (distance and the
      field-of-view test), PaPE explicit 5m + 2 (Eq. 9 with direct differences) plus its
      W_a/W_b/W_p projections. CoPE: the gate products again (2 E), sigmoid, suffix sums
      and interpolation, 2 E + 12, plus q . e[p] at every integer position, 2 E npos_max per
      query (as much as the gates at the default npos_max, the grid + 1; until stop 61 left
      out, which put CoPE's bound at 1.022 instead of 1.043 at ViT-B); SaPE²: gates 2 E + 4,
      and Eq. 15's two distances over the W + H vector entries, 3 (W + H), plus per axis
      q . e[p] at every integer position of its table, 2 E npos_max per query (npos_max the
      longer side + 1 by default; until stop 64 left out, as CoPE's was).
    * widened q/k (pape, pape-ri, efficient): q.k over the extra channels, 2 N^2 H w (v
      stays unpadded on CUDA), with w after the bf16 hi/lo split (3x, ``bf16``) and padding;
      plus the coefficient projections (PaPE: W_a, W_b: 4 N D H m; W_p: 2 N H m P; the
      features ~ 8 N H m; PaPE-RI: w_α, 2 N D H). PaPE in position space (``space``,
      "auto" on CUDA; adapters/pape.py): w = 1 + P(P+1)/2 + P; W_b is folded with W_p, so
      the projections are 2 N D H (m + P); a meets W_p's outer products, 2 N H m (P(P+1)/2
      + P^2), in place of the m-wide features; 8 N H P^2 for the P-wide ones; its explicit
      form (``space: position`` asked for) 3 P(P+1)/2 + 3 P + 2 per pair instead of 5 m + 2.
      ``low_precision: bias`` in bf16: the
      same product unpadded, to float32 accuracy as six bf16 piece products on the tensor
      cores (adapters/_float32_product.py), 12 N^2 H w, and the bias's add.

    Training costs about three forwards for every term alike, so the training bound is the
    same ratio. The bound ignores memory traffic, which is what elementwise work costs.
    """
    from pe_bench.harness.grid.methods import parse_method

    parsed = parse_method(method)
    options = dict(parsed.options)
    n, d, h, layers = tokens, config.dim, config.num_heads, config.depth
    e, p = d // h, pos_dim
    pairs = layers * h * n * n
    side = math.isqrt(max(n - 1, 1))
    v_padded = torch.device(device).type != "cuda"  # CUDA's SDPA takes v narrower than q and k
    if parsed.name == "nopos":
        return 0.0
    if parsed.name in ("sincos", "abspos", "cape"):
        return 4.0 * n * d
    if parsed.name == "wepe":
        # Linear(4 -> D) (8 N D), gamma and the add (2 N D); the features: direct, the
        # truncated Weierstrass sums per token (``WEPE_FLOPS_PER_TERM`` per lattice term); LUT,
        # a bilinear sample of the 4 channels (the table is built once per step for the batch)
        if options.get("mode", "direct") == "lut":
            return 10.0 * n * d + n * 4 * 8.0
        return 10.0 * n * d + n * WEPE_FLOPS_PER_TERM * options.get("num_terms", 120)
    if parsed.name in ("rope", "rope-mixed"):
        return layers * 8.0 * n * d
    if parsed.name in ("string-cayley", "string-circulant"):
        folded = basis_folded(options.get("basis", "auto"), torch.device(device).type)
        return layers * 8.0 * n * d + (0.0 if folded else layers * 4.0 * n * d * e)
    if parsed.name == "alibi":
        return pairs * (3.0 * p + 3)
    if parsed.name == "relpos":
        return pairs * (4.0 * p + 2)
    if parsed.name == "lookhere":
        return pairs * (3.0 * p + 8)
    if parsed.name == "cope":
        npos_max = options.get("npos_max") or side * side + 1  # CoPE's default: the grid + 1
        return pairs * (2.0 * e + 12) + layers * h * n * 2.0 * e * npos_max
    if parsed.name == "sape2":
        npos_max = options.get("npos_max") or side + 1  # SaPE²'s default: the longer grid side + 1
        return pairs * (2.0 * e + 4 + 3 * 2 * side) + layers * h * n * 2 * 2.0 * e * npos_max
    if parsed.name == "pape":
        pape_options = PaPEOptions(**options)
        m = pape_options.m if pape_options.project else p
        projections = layers * (4.0 * n * d * h * m + 2.0 * n * h * m * p + 8.0 * n * h * m)
        if in_position_space(pape_options, p, torch.device(device).type):
            # W_a and W_b folded with W_p (m + P rows per head); a times W_p's outer products
            # (M_i); P-wide features
            t = p * (p + 1) // 2
            coefficients = layers * (2.0 * n * d * h * (m + p) + 2.0 * n * h * m * (t + p * p) + 8.0 * n * h * p * p)
            if pape_options.form == "explicit":  # per pair: P differences, T products, T + P multiply-adds
                return coefficients + pairs * (3.0 * t + 3 * p + 2)
            widths = feature_widths(pape_options, p)["position"]
            return coefficients + _widened_flops(widths, options, pairs, bf16, v_padded)
        if pape_options.form == "explicit":
            return projections + pairs * (5.0 * m + 2)
        widths = feature_widths(pape_options, p)["projected"]
        return projections + _widened_flops(widths, options, pairs, bf16, v_padded)
    if parsed.name == "pape-ri":
        projections = layers * 2.0 * n * d * h
        if options.get("form", "efficient") == "explicit":
            return projections + pairs * (3.0 * p + 4)
        return projections + _widened_flops(p + 2, options, pairs, bf16, v_padded)
    return None


def flop_bound(
    method: str, config: ModelConfig, image_size: int, bf16: bool = True, device: str = "cuda"
) -> float | None:
    """The FLOP model's time ratio of ``method`` to nopos on a ViT on ``device``: the best it can do."""
    side = image_size // config.patch_size
    tokens = side * side + 1
    base = vit_forward_flops(config, tokens, 3 * config.patch_size**2)
    extra = encoding_flops(method, config, tokens, 2, bf16, device)
    return None if extra is None else (base + extra) / base


def attention_kernels(model: torch.nn.Module, images: torch.Tensor, device: str) -> str:
    """The attention kernels the model runs: FLEX (FlexAttention) and/or SDPA's choices."""
    from pe_bench.harness import attention as attention_module

    real = attention_module.flex_attention_with_masks
    used_flex = []

    def spy(*args, **kwargs):
        used_flex.append(True)
        return real(*args, **kwargs)

    attention_module.flex_attention_with_masks = spy
    try:
        sdpa = sdpa_backend(model, images, device)
    finally:
        attention_module.flex_attention_with_masks = real
    if not used_flex:
        return sdpa
    return "FLEX" if sdpa.startswith("none") else f"FLEX+{sdpa}"


@dataclass
class _Baseline:
    """nopos's measuring jobs, alive through the whole img/s table so that every other row's
    timed calls alternate with nopos calls (``paired.py``), and every nopos call timed on
    the way; by column (``train_img_s_b128``, ...)."""

    jobs: dict[str, Callable[[], None]]
    seconds: dict[str, list[float]]

    def over_the_run(self, column: str, batch: int) -> dict[str, float]:
        """nopos's img/s over all its timed calls of the run (median, 10th and 90th
        percentiles, number of calls): how steady the machine was while the table ran."""
        seconds = self.seconds[column]
        deciles = statistics.quantiles(seconds, n=10, method="inclusive") if len(seconds) > 1 else seconds * 9
        return {  # the slowest calls (90th percentile of time) are the 10th percentile of img/s
            "median": round(batch / statistics.median(seconds), 1),
            "p10": round(batch / deciles[-1], 1),
            "p90": round(batch / deciles[0], 1),
            "calls": len(seconds),
        }


def _measure_method(
    method: str, spec: BenchSpec, baseline: _Baseline | None
) -> tuple[dict[str, object], dict[str, tuple[Callable[[], None], PairedTiming]]]:
    """img/s of training and inference at every batch of ``spec``, every timed call right
    after one of nopos's (``baseline``; None while measuring nopos itself), with the median
    of the per-pair time ratios (``_vs_nopos``) and their IQR; peak memory of the largest
    training batch (this method's own, from the CUDA allocator; None on CPU) and the
    kernels; failures as text. Returns the row and, per column that ran, the job and its
    timing (nopos's become the baseline)."""
    row: dict[str, object] = {"method": method}
    cuda, threads = spec.device.startswith("cuda"), spec.threads or torch.get_num_threads()
    resident = torch.cuda.memory_allocated() if cuda else 0  # nopos's jobs, while measuring another
    try:
        model, size = _build_vit(method, BenchSpec(**{**spec.__dict__, "compile": False}))
        # at the largest batch, whose training step the targets are about: the kernel
        # can depend on it (a per-sample bias's elements decide Flex against the dense bias)
        images = torch.randn(max(spec.batches), 3, size, size, device=spec.device)
        # timm's attention is not ours to spy on: its row names the model instead
        row["kernel"] = TIMM_MODELS[spec.model] if method == TIMM_ROW else attention_kernels(model, images, spec.device)
        if spec.compile:
            compile_for_bench(model)
    except Exception as error:  # a method that cannot even be built is one row of the table
        row["kernel"] = failure_cell(error)
        return row, {}
    ran: dict[str, tuple[Callable[[], None], PairedTiming]] = {}
    # the largest batch first, so that its training peak holds no smaller batch's optimiser
    # state (the jobs that ran stay alive: nopos's are the baseline)
    with recording(spec.compile) as compiled:  # the kernels the compiled graphs run (``--compile``)
        for batch in sorted(spec.batches, reverse=True):
            images = torch.randn(batch, 3, size, size, device=spec.device)
            jobs = {
                "train": _TrainStep(model, images, spec.device),
                "infer": lambda x=images: _inference(model, x, spec.device),
            }
            for mode, job in jobs.items():
                column = f"{mode}_img_s_b{batch}"
                peak = mode == "train" and batch == max(spec.batches)
                if peak:
                    row["train_peak_mib"] = None
                try:
                    # two warm-up calls (compilation, allocator, autotuning) with the timed calls'
                    # CPU threads: Dynamo guards compiled code on the thread count, so a model
                    # warmed up with another count compiled again inside its first timed calls
                    # (`--compile --threads 1` on a 2-core CPU timed nopos at 0.6 img/s)
                    with compiled.attributing(f"{method}:{mode}"):
                        time_call(job, threads)
                        if cuda:
                            torch.cuda.reset_peak_memory_stats()
                        time_call(job, threads)
                    if peak and cuda:  # read now: the timed calls alternate with nopos's
                        row["train_peak_mib"] = round((torch.cuda.max_memory_allocated() - resident) / 2**20, 1)
                    reference = None if baseline is None else baseline.jobs.get(column)
                    timing = paired_timing(job, reference, spec.repeats, threads)
                except Exception as error:  # OOM, a kernel that refuses the shapes, ...
                    row[column] = failure_cell(error)
                    continue
                row[column] = round(batch / timing.median_seconds, 1)
                if reference is not None:
                    row[f"{column}_vs_nopos"] = round(timing.slowdown, 3)
                    row[f"{column}_vs_nopos_iqr"] = round(timing.slowdown_iqr, 3)
                    baseline.seconds[column] += timing.reference_seconds
                ran[column] = (job, timing)
    if spec.compile and method != TIMM_ROW:
        row["kernel"] = compiled.column(method, row["kernel"])
    return row, ran


# past Dynamo's recompile limit a compiled model or Flex kernel would silently run eagerly (Flex
# unfused): a slow number that looks like the compiled one's; make it the row's error instead
@torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
def throughput_table(spec: BenchSpec, on_row: Callable[[dict], None] | None = None) -> pd.DataFrame:
    """Per encoding: training and inference img/s at each batch of ``spec`` (bf16 autocast on
    CUDA), how many times slower than nopos (``_vs_nopos``, the issue's "nopos / this"; the
    median over pairs of one nopos call and one of the encoding's, ``_vs_nopos_iqr`` their
    spread), that over the FLOP model's bound (``_vs_bound``, 1.0 = as fast as its arithmetic
    allows), peak training memory at the largest batch, and the attention kernels used. A
    measurement that fails (out of memory, kernel error) shows as text in its cell.

    nopos is measured first and its model stays; every other encoding is built, measured and
    freed in turn (a ViT-B table needs two models' memory), its timed calls alternating with
    nopos calls, so drift of the machine during a long table cancels in the ratios; nopos's
    img/s over all its calls of the run is in ``table.attrs["nopos_over_the_run"]``. ``on_row``
    sees each row as soon as it is measured (a long GPU run killed at its time limit still
    leaves the rows it finished); interrupted (KeyboardInterrupt, e.g. a deadline's SIGINT)
    after nopos, it returns the rows measured so far, with the methods not measured in
    ``table.attrs["interrupted"]``. The method ``timm`` is timm's ViT of the same shape
    (``TIMM_MODELS``), the reference that nopos should match or beat.
    """
    methods = list(dict.fromkeys(("nopos", *spec.methods)))
    config, default_size = MODELS[spec.model]
    size = spec.image_size or default_size
    rows, baseline, interrupted = [], None, []
    for index, method in enumerate(methods):
        try:
            row, ran = _measure_method(method, spec, baseline)
        except KeyboardInterrupt:
            # A deadline (Ctrl-C, `timeout -s INT`) stops the table, not the report: the rows
            # measured so far get their bounds and nopos's spread; the method cut off mid-way
            # leaves no half row, and the ones not reached are named in attrs["interrupted"].
            if baseline is None:
                raise  # not even nopos: no ratio to report
            interrupted = methods[index:]
            break
        if baseline is None:  # nopos: every later call pairs with its jobs
            jobs = {column: job for column, (job, _) in ran.items()}
            baseline = _Baseline(jobs, {column: list(timing.seconds) for column, (_, timing) in ran.items()})
            row.update({f"{column}_vs_nopos": 1.0 for column in ran})
        del ran  # another encoding's model and optimiser states: freed before the next is built
        rows.append(row)
        if on_row is not None:
            on_row(row)
        if spec.device.startswith("cuda"):
            gc.collect()  # a compiled module refers to itself (its compiled call): a cycle
            torch.cuda.empty_cache()
    table = pd.DataFrame(rows).set_index("method")
    built = [not str(kernel).startswith(("error:", "OOM")) for kernel in table["kernel"]]
    bf16 = spec.device.startswith("cuda")
    bounds = [
        flop_bound(m, config, size, bf16, spec.device) if ok and m != TIMM_ROW else None
        for m, ok in zip(table.index, built, strict=True)
    ]
    table["flop_bound"] = [None if b is None else round(b, 3) for b in bounds]
    for batch in spec.batches:
        for mode in ("train", "infer"):
            column = f"{mode}_img_s_b{batch}"
            ratio_column = f"{column}_vs_nopos"
            if ratio_column not in table:  # nopos failed here: nothing to compare with
                table[ratio_column] = None
            table[f"{column}_vs_bound"] = [
                None if pd.isna(r) or b is None else round(r / b, 3)
                for r, b in zip(table[ratio_column], bounds, strict=True)
            ]
    prefixes = [f"{mode}_img_s_b{b}" for b in spec.batches for mode in ("train", "infer")]
    measured = [c for prefix in prefixes for c in table if c.startswith(prefix)]
    order = ["kernel", "flop_bound", *measured, "train_peak_mib"]
    table = table[[c for c in order if c in table]]
    table.attrs["interrupted"] = interrupted
    if baseline is not None:
        table.attrs["nopos_over_the_run"] = {
            column: baseline.over_the_run(column, int(column.rsplit("_b", 1)[1])) for column in baseline.seconds
        }
    return table
