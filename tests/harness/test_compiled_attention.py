"""``bench --compile``'s kernel column read from the compiled graphs
(harness/reports/compiled_attention.py), not from an eager probe of the model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from pe_bench.harness.reports.compiled_attention import CompiledAttention, kernel_of, recording


def _attention(q: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, q, q).sum()


def test_backend_operators_are_named_as_sdpa_names_them():
    ops = torch.ops.aten
    assert kernel_of(ops._scaled_dot_product_flash_attention_for_cpu.default) == "FLASH_ATTENTION"
    assert kernel_of(ops._scaled_dot_product_flash_attention_for_cpu_backward.default) == "FLASH_ATTENTION"
    assert kernel_of(ops._scaled_dot_product_cudnn_attention.default) == "CUDNN_ATTENTION"
    assert kernel_of(ops._scaled_dot_product_efficient_attention_backward.default) == "EFFICIENT_ATTENTION"
    assert kernel_of(torch.ops.higher_order.flex_attention) == "FLEX"
    assert kernel_of(ops.bmm.default) is None


@pytest.fixture
def fresh_record(monkeypatch):
    """The process-wide record (``compiled_attention.SEEN``) replaced by an empty one."""
    from pe_bench.harness.reports import compiled_attention

    monkeypatch.setattr(compiled_attention, "SEEN", CompiledAttention())


def test_the_compiled_graphs_name_their_kernel_per_mode(fresh_record):
    """Inductor's graphs of a training step (forward and backward) and of an inference call,
    each attributed to its mode; the math backend, written out as products, is MATH."""
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    torch._dynamo.reset()
    with recording() as compiled:
        with compiled.attributing("m:train"):
            torch.compile(_attention, dynamic=False)(q).backward()
        torch._dynamo.reset()
        with compiled.attributing("m:infer"), sdpa_kernel(SDPBackend.MATH), torch.no_grad():
            torch.compile(_attention, dynamic=False)(q)
    assert compiled.kernels("m:train") == "FLASH_ATTENTION"
    assert compiled.kernels("m:infer") == "MATH"
    assert compiled.kernels("other:infer") is None  # compiled nothing
    assert compiled.column("m", "FLASH_ATTENTION") == "MATH (training: FLASH_ATTENTION) (eager: FLASH_ATTENTION)"


def test_graphs_compiled_outside_an_attribution_are_no_ones(fresh_record):
    q = torch.randn(2, 4, 16, 8)
    torch._dynamo.reset()
    with recording() as compiled:
        torch.compile(_attention, dynamic=False)(q)
    assert compiled.labels() == set()


def _graph(*targets) -> torch.fx.Graph:
    """A graph calling ``targets`` (what the recorder reads of a lowered graph)."""
    graph = torch.fx.Graph()
    for target in targets:
        graph.call_function(target, ())
    return graph


def test_the_column_says_where_it_did_not_see_the_compiled_kernel():
    ops, compiled = torch.ops.aten, CompiledAttention()
    assert compiled.column("rope", "CUDNN_ATTENTION") == "CUDNN_ATTENTION (eager probe; no compiled graph seen)"
    for mode in ("infer", "train"):
        with compiled.attributing(f"rope:{mode}"):
            compiled.read(_graph(ops.mul.Tensor, ops._scaled_dot_product_cudnn_attention.default))
    assert compiled.column("rope", "CUDNN_ATTENTION") == "CUDNN_ATTENTION"
    assert compiled.column("rope", "FLASH_ATTENTION") == "CUDNN_ATTENTION (eager: FLASH_ATTENTION)"
    with compiled.attributing("alibi:train"):
        compiled.read(_graph(torch.ops.higher_order.flex_attention))
        compiled.read(_graph(ops._scaled_dot_product_efficient_attention_backward.default))
    assert compiled.kernels("alibi:train") == "FLEX+EFFICIENT_ATTENTION"


@pytest.fixture
def graphs_read_without_inductor(monkeypatch):
    """``bench``'s compiled models compiled by AOT autograd alone, their graphs read as
    Inductor's post-grad pass would read them (``test_the_compiled_graphs_name_their_kernel_per_mode``
    runs that pass), without Inductor's C++ compile (half a minute a table here); the eager
    probe made to answer EAGER_PROBE, so that a row shows which of the two it reports."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from pe_bench.harness.compile import compile_model
    from pe_bench.harness.reports import bench, compiled_attention, throughput

    monkeypatch.setattr(compiled_attention, "SEEN", CompiledAttention())  # this test's own

    def read(graph_module, example_inputs):
        compiled_attention.SEEN.read(graph_module.graph)
        return make_boxed_func(graph_module.forward)

    backend = aot_autograd(fw_compiler=read, bw_compiler=read)
    monkeypatch.setattr(bench, "compile_model", lambda model, **kw: compile_model(model, backend=backend, **kw))
    monkeypatch.setattr(throughput, "attention_kernels", lambda *args: "EAGER_PROBE")
    monkeypatch.setattr(bench, "sdpa_backend", lambda *args: "EAGER_PROBE")
    torch._dynamo.reset()


def test_compiled_rows_name_the_kernel_their_graphs_call(graphs_read_without_inductor):
    """``bench --compile``: the throughput table's and the forward table's rows; the second
    table's nopos reuses the first's compiled graphs (Dynamo's guards hold for a new model of
    the same method and shapes), so it compiles nothing and reads what the first one saw."""
    from pe_bench.harness.reports import bench, throughput

    spec = bench.BenchSpec(model="tiny", methods=(), batches=(2,), train_batch=0, repeats=1, compile=True)
    assert throughput.throughput_table(spec).loc["nopos", "kernel"] == "FLASH_ATTENTION (eager: EAGER_PROBE)"
    assert bench.forward_table(spec).loc["nopos", "sdpa"] == "FLASH_ATTENTION (eager: EAGER_PROBE)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["nopos", "rope", "pape"])
def test_compiled_cuda_layers_call_the_eager_probes_kernel(method, fresh_record):
    """CUDA, bf16, one ViT-B layer at 224² (batch 8): the kernel a compiled training step and
    inference call is the one the eager probe names. Compiled rope trained at 1.20x compiled
    nopos on an H200 (11-27) for elementwise work worth a few per cent; a compiled graph that
    calls another kernel (AOT autograd picks it on the compiled graph's strides) would be one
    cause, and this names it."""
    from pe_bench.adapters import EncodingFactory
    from pe_bench.harness.config import ModelConfig
    from pe_bench.harness.reports.bench import _inference, _TrainStep, compile_for_bench, sdpa_backend
    from pe_bench.tasks._shared.vit import ViT, image_geometry

    config = ModelConfig(dim=768, depth=1, num_heads=12, patch_size=16)
    torch.manual_seed(0)
    model = ViT(EncodingFactory(method, {}), image_geometry((224, 224), 16), config, 3, 1000).cuda()
    images = torch.randn(8, 3, 224, 224, device="cuda")
    eager = sdpa_backend(model, images, "cuda")
    torch._dynamo.reset()
    compile_for_bench(model)
    with recording() as compiled:
        with compiled.attributing(f"{method}:train"):
            _TrainStep(model, images, "cuda")()
        with compiled.attributing(f"{method}:infer"):
            _inference(model, images, "cuda")
    assert compiled.column(method, eager) == eager
