"""``trainer.attention_kernel`` and ``bench --attention-kernel``: a model's attention layers
carry their own choice of the bias encodings' kernel (FlexAttention or SDPA with the dense
bias), which wins over the process's, gives the same function, and is recorded with a
cell as it resolved.

On CPU FlexAttention runs forward only, so the kernels are compared without gradients
here; tests/harness/test_flex_attention.py's ``gpu`` tests compare gradients on CUDA."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import EncodingFactory, Geometry, PositionLayout, build
from pe_bench.harness import attention as attention_module
from pe_bench.harness.attention import (
    AUTO_ON_CUDA,
    DENSE_BIAS_MAX_ELEMENTS,
    Attention,
    attention_kernel,
    attention_mask,
    set_attention_kernel,
    wants_flex,
)
from pe_bench.harness.cli import main
from pe_bench.harness.config import ConfigError, ModelConfig, load_run_config, parse_overrides
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.grid.runner import effective_trainer, model_parts, resolve_attention_kernel
from pe_bench.harness.reports.sweep import _attention_layer
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.vit import ViT, image_geometry

TINY = ModelConfig(dim=32, depth=2, num_heads=4, mlp_ratio=2.0, patch_size=4)


def _alibi_vit() -> ViT:
    torch.manual_seed(0)
    model = ViT(EncodingFactory("alibi", {}), image_geometry((16, 16), 4), TINY, 3, 10).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "encoding" in name:  # slopes large enough that the bias moves the attention
                parameter.normal_(0.0, 0.5)
    return model


def _count_flex_calls(monkeypatch) -> list[int]:
    calls = []
    original = attention_module.flex_attention_with_masks

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(attention_module, "flex_attention_with_masks", counted)
    return calls


def test_a_models_own_kernel_gives_the_same_function_and_a_block_overrides_it(monkeypatch):
    calls = _count_flex_calls(monkeypatch)
    model = _alibi_vit()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        dense = model(images)  # auto on CPU: the dense reference
        assert calls == []
        set_attention_kernel(model, "flex")
        flex = model(images)
        assert len(calls) == TINY.depth
        with attention_kernel("auto"):  # leaves the layers' own choice
            assert torch.equal(model(images), flex)
        assert len(calls) == 2 * TINY.depth
        with attention_kernel("dense"):  # a measurement's block overrides it
            assert torch.equal(model(images), dense)
        assert len(calls) == 2 * TINY.depth
        set_attention_kernel(model, "auto")
        with attention_kernel("flex"):
            model(images)
        assert len(calls) == 3 * TINY.depth
    assert {layer.kernel for layer in model.modules() if isinstance(layer, Attention)} == {"auto"}
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


def test_auto_on_cuda_keeps_small_dense_biases_and_sends_large_ones_to_flex():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # a device object needs no GPU
    small, large = (lambda: DENSE_BIAS_MAX_ELEMENTS), (lambda: DENSE_BIAS_MAX_ELEMENTS + 1)
    assert not wants_flex(cuda, "auto", small) and wants_flex(cuda, "auto", large)
    assert wants_flex(cuda, "auto") and not wants_flex(cpu, "auto", large)
    assert wants_flex(cuda, "flex", small) and not wants_flex(cuda, "dense", large)
    with attention_kernel("flex"):
        assert wants_flex(cpu, "dense", small)
    with attention_kernel("dense"):
        assert not wants_flex(cuda, "flex", large)


def _dense_elements(
    name: str, options: dict, padded: bool, batch: int = 3, grid=(4, 5), bf16: bool = False
) -> tuple[int, int]:
    """The encoding's declared dense-bias elements, and what its dense path's bias (or, for
    pape's explicit form, its per-pair differences) holds when built (0: no bias); ``bf16``
    under bf16 autocast (PaPE's positional bias form)."""
    geometry = Geometry(pos_dim=2, grid_shape=grid, num_prefix_tokens=1)
    encoding = build(name, geometry, 32, 4, depth=1, options=options)
    layer = Attention(32, 4, encoding.make_layer(0)).eval()
    layout = encoding.prepare(PositionLayout.grid(batch, grid, 1))
    if padded:
        layout.valid = torch.ones(batch, layout.coords.shape[1], dtype=torch.bool)
        layout.valid[-1, -3:] = False
    x = torch.randn(batch, layout.coords.shape[1], 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        q, k, _, inputs = layer._project(x, layout.sharing_features(), None, None, False)
        declared = layer.encoding.dense_bias_elements(q, k, inputs)
        bias, _ = attention_mask(layer.encoding.bias(q, k, inputs), inputs.key, False, q.shape[-2], q.dtype)
    return declared, 0 if bias is None or bias.dtype == torch.bool else bias.numel()


@pytest.mark.parametrize("padded", [False, True], ids=["shared", "padded"])
@pytest.mark.parametrize("name", ["alibi", "relpos", "lookhere", "sape2", "cope", "pape-ri[form=explicit]"])
def test_declared_dense_bias_elements_are_what_the_dense_path_builds(name, padded):
    """A grid shared by the batch makes one sample's bias; padding (masked in per sample)
    and content (SaPE²'s and CoPE's gates, PaPE-RI's alpha) make every sample's."""
    method = parse_method(name)
    declared, built = _dense_elements(method.name, dict(method.options), padded)
    assert declared == built
    tokens = 1 + 4 * 5
    per_sample = padded or name not in ("alibi", "relpos", "lookhere")
    assert declared == (3 if per_sample else 1) * 4 * tokens * tokens


@pytest.mark.parametrize("name", ["pape", "pape-ri"])
def test_pape_declares_its_positional_bias_and_no_bias_for_the_widened_form(name):
    """What the core weighs for Flex and for chunks of queries (test_bias_chunks.py): the
    bias form's (B, H, Nq, Nk) logits in 16 bits, nothing where q and k are widened."""
    declared, built = _dense_elements(name, {"low_precision": "bias"}, padded=False, bf16=True)
    assert declared == built == 3 * 4 * 21 * 21
    for options, bf16 in (({"low_precision": "bias"}, False), ({}, True), ({}, False)):
        assert _dense_elements(name, options, padded=False, bf16=bf16) == (0, 0)


def test_pape_explicit_declares_its_per_pair_differences():
    declared, built = _dense_elements("pape", {"form": "explicit", "m": 6}, padded=False)
    assert declared == 6 * built == 6 * 3 * 4 * 21 * 21


def test_unknown_kernel_is_named():
    with pytest.raises(ValueError, match="set_attention_kernel.*auto.*flex.*dense.*'fast'"):
        set_attention_kernel(_alibi_vit(), "fast")
    with pytest.raises(ConfigError, match="trainer.attention_kernel"):
        load_run_config("imagenet", "tiny", parse_overrides(["trainer.attention_kernel=fast"]))


def test_the_trainer_setting_resolves_by_device_and_is_recorded(monkeypatch):
    def config(kernel: str, accelerator: str = "auto"):
        overrides = [f"trainer.attention_kernel={kernel}", f"trainer.accelerator={accelerator}"]
        return load_run_config("imagenet", "tiny", parse_overrides(overrides))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_attention_kernel(config("auto")) == "dense"
    assert resolve_attention_kernel(config("dense")) == "dense"
    assert effective_trainer(config("auto"))["attention_kernel"] == "dense"
    with pytest.raises(ValueError, match=r"trainer.attention_kernel: flex trains on CUDA only.*auto or dense"):
        resolve_attention_kernel(config("flex"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_attention_kernel(config("auto")) == AUTO_ON_CUDA == "flex above 8388608 bias elements, else dense"
    assert effective_trainer(config("auto"))["attention_kernel"] == AUTO_ON_CUDA
    assert resolve_attention_kernel(config("flex")) == "flex"
    assert resolve_attention_kernel(config("dense")) == "dense"
    assert resolve_attention_kernel(config("auto", "cpu")) == "dense"
    with pytest.raises(ValueError, match="flex trains on CUDA only"):
        resolve_attention_kernel(config("flex", "cpu"))


def test_a_cells_model_carries_the_trainers_kernel():
    config = load_run_config("imagenet", "tiny", parse_overrides(["trainer.attention_kernel=dense"]))
    task = get_task("imagenet")(config)
    method = parse_method("alibi")
    model, _, _ = model_parts(task, EncodingFactory(method.name, dict(method.options)), seed=0)
    layers = [module for module in model.modules() if isinstance(module, Attention)]
    assert layers and {layer.kernel for layer in layers} == {"dense"}


def test_bench_layers_take_the_kernel_asked_for(monkeypatch):
    calls = _count_flex_calls(monkeypatch)
    outputs = {}
    for kernel in ("dense", "flex"):
        torch.manual_seed(0)
        layer, x, layout = _attention_layer("alibi", 36, 32, 4, kernel=kernel)
        assert layer.kernel == kernel
        with torch.no_grad():
            outputs[kernel] = layer(x, layout)
    assert len(calls) == 1
    torch.testing.assert_close(outputs["flex"], outputs["dense"], atol=1e-5, rtol=1e-5)


def test_bench_refuses_to_time_flex_training_on_the_cpu(capsys):
    assert main(["bench", "--device", "cpu", "--attention-kernel", "flex", "--methods", "alibi"]) != 0
    error = capsys.readouterr().err
    assert "--attention-kernel flex on the CPU" in error and "--train-batch 0" in error


def test_bench_refuses_compiled_flex_on_the_cpu(capsys):
    """Inductor's CPU Flex template cannot lower the score_mods (torch 2.14): a clear refusal
    before any model is built, instead of a lowering traceback in the middle of the table."""
    argv = ["bench", "--device", "cpu", "--attention-kernel", "flex", "--methods", "alibi", "--train-batch", "0"]
    assert main([*argv, "--compile"]) != 0
    error = capsys.readouterr().err
    assert "--compile --attention-kernel flex on the CPU" in error and "--attention-kernel dense" in error


@pytest.mark.parametrize(("name", "options"), [("alibi", {}), ("pape", {"form": "explicit", "m": 4})])
def test_autos_size_rule_traces_in_one_graph(name, options):
    """On CUDA the rule runs inside compiled models: counting the dense bias (strides and
    shapes, no data) must not break the graph. Traced here with a CUDA device object."""
    geometry = Geometry(pos_dim=2, grid_shape=(4, 5), num_prefix_tokens=1)
    encoding = build(name, geometry, 32, 4, depth=1, options=options)
    layer = Attention(32, 4, encoding.make_layer(0)).eval()
    layout = encoding.prepare(PositionLayout.grid(3, (4, 5), 1))

    def flex_or_dense(x: torch.Tensor, layout: PositionLayout) -> torch.Tensor:
        q, k, _, inputs = layer._raw_heads(x, layout.sharing_features(), None, None, False)
        flex = wants_flex(torch.device("cuda"), "auto", lambda: layer.encoding.dense_bias_elements(q, k, inputs))
        return q * (2.0 if flex else 1.0)

    x = torch.randn(3, 21, 32)
    torch._dynamo.reset()
    compiled = torch.compile(flex_or_dense, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, layout), flex_or_dense(x, layout))


def test_a_grid_this_process_would_train_refuses_flex_on_the_cpu_before_any_cell(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["run", "--tasks", "imagenet", "--methods", "alibi", "--seeds", "0", "--profile", "tiny"]
    argv += ["--set", "trainer.attention_kernel=flex", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) != 0
    assert "trainer.attention_kernel: flex trains on CUDA only" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # no cell was started, none recorded as failed
