"""The dense bias built one chunk of queries at a time (harness/attention.py, ``query_chunks``):
the same function as the whole bias, outputs and gradients, for every encoding that allows it
(``bias_by_query_chunks``), with CLS tokens, per-sample padding and cross-attention; chunks
only above the budget, never for causal attention or for biases built for all queries at
once; and without autograd no built bias exceeds the budget."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, build, cope, pape, pape_ri
from pe_bench.harness.attention import (
    DENSE_BIAS_CHUNK_ELEMENTS,
    Attention,
    dense_bias_chunk_elements,
)

DIM, HEADS, GRID, PREFIX, BATCH = 32, 2, (5, 6), 1, 3
TOKENS = PREFIX + GRID[0] * GRID[1]

#: (method, options, dtype): the float64 reference forms, and PaPE's and PaPE-RI's positional
#: bias form, which exists only with 16-bit q/k (float32 weights under bf16 autocast)
CHUNKED = [
    ("alibi", {}, torch.float64),
    ("relpos", {}, torch.float64),
    ("lookhere", {}, torch.float64),
    ("cope", {}, torch.float64),
    ("pape", {"form": "explicit"}, torch.float64),
    ("pape-ri", {"form": "explicit"}, torch.float64),
    ("pape", {"low_precision": "bias"}, torch.float32),
    ("pape-ri", {"low_precision": "bias"}, torch.float32),
]


def _layer(name: str, options: dict, dtype: torch.dtype) -> tuple[Attention, PositionLayout]:
    torch.manual_seed(0)
    encoding = build(name, Geometry(pos_dim=2, grid_shape=GRID, num_prefix_tokens=PREFIX), DIM, HEADS, 1, options)
    layer = Attention(DIM, HEADS, encoding.to(dtype).make_layer(0)).to(dtype)
    layout = encoding.prepare(PositionLayout.grid(BATCH, GRID, PREFIX))
    layout.valid = torch.ones(BATCH, TOKENS, dtype=torch.bool)
    layout.valid[-1, -4:] = False  # padding: every sample's own mask
    return layer, layout


def _output_and_gradients(layer: Attention, layout: PositionLayout, x: torch.Tensor, budget: int | None):
    x = x.clone().requires_grad_()
    layer.zero_grad(set_to_none=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=x.dtype == torch.float32)
    with autocast, dense_bias_chunk_elements(budget or DENSE_BIAS_CHUNK_ELEMENTS):
        out = layer(x, layout.sharing_features())
    out.float().square().sum().backward()
    grads = [x.grad] + [p.grad for p in layer.parameters() if p.grad is not None]
    return out.detach(), grads


def _relative(new: torch.Tensor, ref: torch.Tensor) -> float:
    return ((new.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize(("name", "options", "dtype"), CHUNKED, ids=lambda v: str(v) if v else "")
def test_the_bias_in_chunks_of_queries_is_the_whole_bias(name, options, dtype, monkeypatch):
    layer, layout = _layer(name, options, dtype)
    x = torch.randn(BATCH, TOKENS, DIM, dtype=dtype)
    chunks = []
    original = Attention._chunked_bias_attention

    def counted(self, q, k, v, inputs, rows):
        chunks.append(rows)
        return original(self, q, k, v, inputs, rows)

    whole, whole_grads = _output_and_gradients(layer, layout, x, None)
    monkeypatch.setattr(Attention, "_chunked_bias_attention", counted)
    chunked, chunked_grads = _output_and_gradients(layer, layout, x, 50)  # one query per chunk
    assert chunks and len(chunks[0]) == TOKENS  # it did run in chunks (a list per layer call), one query each
    assert len(chunked_grads) == len(whole_grads) > 1
    # float64: summation order only; bf16: the chunk's q/k products and features round alike
    # up to the GEMM's blocking, so the bound is bf16's (and the positional bias stays exact)
    bound = 1e-12 if dtype == torch.float64 else 1e-2
    assert _relative(chunked, whole) < bound
    for new, ref in zip(chunked_grads, whole_grads, strict=True):
        assert _relative(new, ref) < bound


#: (method, options, dtype, where the key-side computation lives, its name): it must run
#: once per attention call
KEY_SIDE = [
    ("pape", {"low_precision": "bias"}, torch.float32, pape, "keys_for_product"),
    ("pape", {"low_precision": "bias"}, torch.float32, pape.ParabolicLayer, "_key_features"),
    ("pape-ri", {"low_precision": "bias"}, torch.float32, pape_ri.ParabolicRILayer, "_key_features"),
    ("cope", {}, torch.float64, cope, "lexicographic_ranks"),
]


@pytest.mark.parametrize(("name", "options", "dtype", "holder", "target"), KEY_SIDE, ids=lambda v: str(v) if v else "")
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_the_chunks_build_the_key_side_once(name, options, dtype, holder, target, grad, monkeypatch):
    """What depends on the keys alone (PaPE's key features and their bf16 pieces, CoPE's
    ranks) is built once per attention call, not once per chunk of queries: the chunks share
    the call's ``key_memo``. The outputs are those of the whole bias (the test above checks
    it with gradients; here the memo's own no_grad form too)."""
    layer, layout = _layer(name, options, dtype)
    x = torch.randn(BATCH, TOKENS, DIM, dtype=dtype)
    original, calls = getattr(holder, target), []

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(holder, target, counted)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.float32)
    with torch.set_grad_enabled(grad), autocast:
        whole = layer(x, layout.sharing_features())
        whole_calls, calls[:] = len(calls), []
        with dense_bias_chunk_elements(50):  # one query per chunk: TOKENS chunks
            chunked = layer(x, layout.sharing_features())
    assert whole_calls == 1 and len(calls) == 1
    assert _relative(chunked.detach(), whole.detach()) < (1e-12 if dtype == torch.float64 else 1e-2)


def test_cross_attention_in_chunks_of_queries():
    torch.manual_seed(0)
    encoding = build("alibi", Geometry(pos_dim=2, grid_shape=GRID, num_prefix_tokens=PREFIX), DIM, HEADS, 1, {})
    layer = Attention(DIM, HEADS, encoding.make_layer(0), cross=True).double()
    query = encoding.prepare(PositionLayout.grid(BATCH, (3, 3), PREFIX))
    key = encoding.prepare(PositionLayout.grid(BATCH, GRID, PREFIX))
    x, context = torch.randn(BATCH, 10, DIM).double(), torch.randn(BATCH, TOKENS, DIM).double()
    whole = layer(x, query, context=context, key=key)
    with dense_bias_chunk_elements(2 * HEADS * TOKENS):  # 2 queries per chunk (one sample's bias)
        q, k, _, inputs = layer._project(x, query, context, key, False)
        chunks = layer.query_chunks(q, k, inputs)
        chunked = layer(x, query, context=context, key=key)
    assert [(rows.start, rows.stop) for rows in chunks] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)


def _chunks(name: str, options: dict, budget: int, causal: bool = False, dtype=torch.float64):
    layer, layout = _layer(name, options, dtype)
    layout.valid = None  # a grid shared by the batch: alibi's bias is one sample's
    x = torch.randn(BATCH, TOKENS, DIM, dtype=dtype)
    with dense_bias_chunk_elements(budget):
        q, k, _, inputs = layer._project(x, layout, None, None, causal)
        return layer.query_chunks(q, k, inputs)


def test_chunks_partition_the_queries_within_the_budget():
    one_sample_row = HEADS * TOKENS  # alibi on a shared grid: (1, H, rows, Nk)
    assert _chunks("alibi", {}, HEADS * TOKENS * TOKENS) is None  # the whole bias fits
    chunks = _chunks("alibi", {}, 7 * one_sample_row)
    assert [(rows.start, rows.stop) for rows in chunks] == [(s, min(s + 7, TOKENS)) for s in range(0, TOKENS, 7)]
    # CoPE's gates are every sample's own: BATCH times the rows per element of budget
    first = _chunks("cope", {}, 7 * one_sample_row * BATCH)[0]
    assert (first.start, first.stop) == (0, 7)
    # PaPE's explicit form holds m differences per pair
    first = _chunks("pape", {"form": "explicit", "m": 4}, 7 * one_sample_row * BATCH * 4)[0]
    assert (first.start, first.stop) == (0, 7)


def test_no_chunks_for_causal_attention_or_whole_query_biases_or_no_bias():
    assert _chunks("alibi", {}, 1, causal=True) is None  # an encoding's causal mask is shape-aligned
    assert _chunks("sape2", {}, 1) is None  # compares two queries' own vectors: all at once
    assert _chunks("rope", {}, 1) is None and _chunks("nopos", {}, 1) is None
    assert _chunks("pape", {}, 1) is None  # the widened q/k build no bias
    assert _chunks("pape", {"low_precision": "bias"}, 1) is None  # float32: the widened form


def test_without_autograd_no_built_bias_exceeds_the_budget():
    """What the chunks are for: evaluation at large grids keeps one chunk's bias at a time."""
    layer, layout = _layer("pape", {"form": "explicit", "m": 4}, torch.float64)
    budget = 4 * BATCH * HEADS * TOKENS * 5  # 5 queries' per-pair differences
    built = []
    bias = layer.encoding.bias

    def recorded(q, k, inputs):
        out = bias(q, k, inputs)
        built.append(out.numel() * 4)  # the m = 4 differences behind every bias element
        return out

    layer.encoding.bias = recorded
    with torch.no_grad(), dense_bias_chunk_elements(budget):
        layer(torch.randn(BATCH, TOKENS, DIM, dtype=torch.float64), layout)
    assert len(built) == -(-TOKENS // 5) and max(built) <= budget


def test_the_budget_must_be_positive():
    with pytest.raises(ValueError, match="dense_bias_chunk_elements.*at least 1"), dense_bias_chunk_elements(0):
        pass


def test_a_compiled_model_runs_the_chunks_eagerly_with_the_same_result():
    """Under torch.compile the chunk loop is a graph break (not unrolled into the graph: at a
    large grid it would be hundreds of chunks per layer); the function stays the same."""
    layer, layout = _layer("alibi", {}, torch.float32)
    x = torch.randn(BATCH, TOKENS, DIM)
    with torch.no_grad(), dense_bias_chunk_elements(50):
        eager = layer(x, layout)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(layer)(x, layout)
        compiled = torch.compile(layer, backend="eager")(x, layout)
    assert explained.graph_break_count >= 1
    assert any("disable" in str(reason.reason) for reason in explained.break_reasons)
    torch.testing.assert_close(compiled, eager)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["cope", "pape[low_precision=bias]", "pape-ri[low_precision=bias]", "alibi"])
def test_chunks_on_cuda_in_bf16_are_the_whole_bias(method):
    """CUDA, bf16 autocast: the chunked dense bias (CoPE's and PaPE's positional bias form
    have no Flex form, so they run it at long sequences; alibi forced onto the dense path)
    gives the whole bias's outputs and gradients, through CUDA's own SDPA kernels."""
    from pe_bench.harness.attention import attention_kernel
    from pe_bench.harness.grid.methods import parse_method

    parsed = parse_method(method)
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=(14, 14), num_prefix_tokens=1)
    encoding = build(parsed.name, geometry, 256, 4, 1, dict(parsed.options)).cuda()
    layer = Attention(256, 4, encoding.make_layer(0)).cuda()
    layout = encoding.prepare(PositionLayout.grid(2, (14, 14), 1, device="cuda"))
    x = torch.randn(2, 197, 256, device="cuda")
    results = []
    for budget in (DENSE_BIAS_CHUNK_ELEMENTS, 2 * 4 * 197 * 16):  # whole, then chunks of 16 queries
        layer.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_()
        autocast = torch.autocast("cuda", dtype=torch.bfloat16)
        with autocast, attention_kernel("dense"), dense_bias_chunk_elements(budget):
            out = layer(xx, layout.sharing_features())
        out.float().square().sum().backward()
        results.append((out.detach(), [xx.grad] + [p.grad for p in layer.parameters() if p.grad is not None]))
    (whole, whole_grads), (chunked, chunked_grads) = results
    assert _relative(chunked, whole) < 1e-2
    for new, ref in zip(chunked_grads, whole_grads, strict=True):
        assert _relative(new, ref) < 2e-2
