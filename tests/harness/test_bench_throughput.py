"""The img/s table of ``pe-bench bench`` (on CUDA by default) and its FLOP model: structure
only, on a tiny CPU model (figures are never asserted: machines are noisy)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from pe_bench.harness.cli import main
from pe_bench.harness.reports import bench, pape_precision, throughput
from pe_bench.harness.reports.bench import MODELS, BenchSpec
from pe_bench.harness.reports.throughput import (
    THROUGHPUT_METHODS,
    encoding_flops,
    flop_bound,
    throughput_table,
    vit_forward_flops,
)

VIT_B = MODELS["vit-b"][0]


def _spec(**changes) -> BenchSpec:
    settings = {"model": "tiny", "methods": ("rope", "pape[m=4]", "alibi"), "batches": (1, 2), "repeats": 1}
    return BenchSpec(**{**settings, **changes})


def test_throughput_table_has_every_column_relative_to_nopos_and_to_the_bound():
    table = throughput_table(_spec())
    assert list(table.index) == ["nopos", "rope", "pape[m=4]", "alibi"]
    for batch in (1, 2):
        for mode in ("train", "infer"):
            column = f"{mode}_img_s_b{batch}"
            assert (table[column] > 0).all()
            assert table.loc["nopos", f"{column}_vs_nopos"] == 1.0
            assert table.loc["nopos", f"{column}_vs_bound"] == 1.0
            ratio, bound = table.loc["pape[m=4]", f"{column}_vs_nopos"], table.loc["pape[m=4]", "flop_bound"]
            assert table.loc["pape[m=4]", f"{column}_vs_bound"] == pytest.approx(ratio / bound, rel=2e-3, abs=1e-3)
    assert table.loc["nopos", "flop_bound"] == 1.0 and table.loc["pape[m=4]", "flop_bound"] > 1.0
    assert table["train_peak_mib"].isna().all()  # the CUDA allocator's figure; none on CPU
    assert "MATH" not in table.loc["rope", "kernel"]
    assert list(table.columns[:2]) == ["kernel", "flop_bound"]


def test_a_failed_measurement_is_a_cell_not_a_crash(monkeypatch):
    real = throughput._inference

    def out_of_memory_at_batch_2(model, images, device):
        if images.shape[0] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return real(model, images, device)

    monkeypatch.setattr(throughput, "_inference", out_of_memory_at_batch_2)
    table = throughput_table(_spec(methods=("rope",)))
    assert (table["infer_img_s_b2"] == "OOM").all()
    assert table["infer_img_s_b2_vs_nopos"].isna().all()
    assert (pd.to_numeric(table["train_img_s_b2"]) > 0).all()


def test_an_encoding_that_cannot_be_built_is_reported():
    table = throughput_table(_spec(methods=("pape[nonsense=1]",)))
    failure = table.loc["pape[nonsense=1]", "kernel"]
    assert failure.startswith("error:") and "nonsense" in failure


def test_the_gpu_table_times_every_shipped_encoding_and_bounds_it():
    """Issue 16 asks every encoding to be near its FLOP bound: the table's default methods name
    each registered encoding (wepe was missing until stop 56), and the model bounds each."""
    from pe_bench.adapters import available
    from pe_bench.harness.grid.methods import parse_method
    from pe_bench.harness.reports.throughput import THROUGHPUT_METHODS

    assert {parse_method(m).name for m in THROUGHPUT_METHODS} >= set(available())
    assert all(flop_bound(m, VIT_B, 224) is not None for m in THROUGHPUT_METHODS)


def test_flop_model_knows_no_plug_in(monkeypatch):
    from types import SimpleNamespace

    from pe_bench.harness.grid import methods

    monkeypatch.setattr(methods, "parse_method", lambda spec: SimpleNamespace(name="my-plugin", options=()))
    assert encoding_flops("my-plugin", VIT_B, 197) is None
    assert flop_bound("my-plugin", VIT_B, 224) is None


def test_flop_model_by_action_point():
    tokens = 197
    base = vit_forward_flops(VIT_B, tokens, 3 * 16 * 16)
    assert base == pytest.approx(2 * 17.6e9, rel=0.02)  # ViT-B/16 at 224: 17.6 G multiply-adds
    assert encoding_flops("nopos", VIT_B, tokens) == 0.0
    assert encoding_flops("alibi", VIT_B, tokens) == 12 * 12 * tokens**2 * (3 * 2 + 3)
    # PaPE's widened q.k in projected space (CPU's default): 2m + 1 = 101 channels padded to
    # 104, or 3 x 101 -> 304 when split in bf16; off CUDA v is padded as wide (P.V twice the cost)
    forced = ("pape[space=projected]", "pape[space=projected,low_precision=round]", "cuda")
    for pape, round_, device in (("pape", "pape[low_precision=round]", "cpu"), forced):  # auto off CUDA, forced
        split = encoding_flops(pape, VIT_B, tokens, device=device)
        rounded = encoding_flops(round_, VIT_B, tokens, device=device)
        v_padded = 2 if device == "cpu" else 1
        assert split - rounded == pytest.approx(12 * 2 * tokens**2 * 12 * (304 - 104) * v_padded)
        assert encoding_flops(pape, VIT_B, tokens, bf16=False, device=device) == rounded
    # the positional bias form: the same 101 channels unpadded, as six bf16 piece products each
    # (float32 accuracy on the tensor cores), plus the bias's add; v keeps its width
    bias = encoding_flops("pape[low_precision=bias,space=projected]", VIT_B, tokens, device="cuda")
    assert bias - rounded == pytest.approx(12 * 12 * tokens**2 * ((12 * 101 + 1) - 2 * 104))
    assert encoding_flops("pape[low_precision=bias,space=projected]", VIT_B, tokens, bf16=False) == rounded
    # PaPE (m = 50): W_a/W_b (4.4 GFLOPs) and the widened q.k; rotations and biases about 1.0x.
    bounds = {pape: flop_bound(pape, VIT_B, 224, device="cpu") for pape in ("pape", "pape[low_precision=round]")}
    assert 1.1 < bounds["pape[low_precision=round]"] < bounds["pape"] < 1.35  # CPU: v padded, P.V widened too
    # in position space (auto on CUDA): 1 + 3 + 2 = 6 channels, 3 x 6 = 18 -> 24 split, 8 rounded;
    # W_b folded with W_p: 2 N D H (m + P); a with W_p's outer products: 2 N H m (3 + 4); 8 N H P^2
    position = encoding_flops("pape", VIT_B, tokens)
    assert position == encoding_flops("pape[space=position]", VIT_B, tokens)
    padded_v = 12 * 2 * tokens**2 * 12 * 24  # forced on the CPU, whose kernels pad v as wide
    assert encoding_flops("pape[space=position]", VIT_B, tokens, device="cpu") == position + padded_v
    coefficients = 12 * (2 * tokens * 768 * 12 * 52 + 2 * tokens * 12 * 50 * 7 + 8 * tokens * 12 * 4)
    assert position == pytest.approx(coefficients + 12 * 2 * tokens**2 * 12 * 24)
    assert 1.05 < flop_bound("pape", VIT_B, 224) < 1.1 < bounds["pape"]
    # the explicit form keeps Eq. 9's 5 m + 2 per pair unless position space is asked for: 3 T + 3 P + 2
    explicit = encoding_flops("pape[form=explicit]", VIT_B, tokens)
    assert explicit == encoding_flops("pape[form=explicit,space=projected]", VIT_B, tokens)
    pairs = 12 * 12 * tokens**2
    position_explicit = encoding_flops("pape[form=explicit,space=position]", VIT_B, tokens)
    assert position_explicit == pytest.approx(coefficients + pairs * 17)
    for method in ("rope", "rope-mixed", "alibi", "sincos", "relpos"):
        assert 1.0 < flop_bound(method, VIT_B, 224) < 1.06, method
    # STRING's basis change: per token 4 N D E per layer; folded into the projections (auto on
    # CUDA) only the rotation, rope-mixed's
    for string in ("string-cayley", "string-circulant"):
        rotation = encoding_flops("rope-mixed", VIT_B, tokens)
        per_token = rotation + 12 * 4 * tokens * 768 * 64
        assert encoding_flops(f"{string}[basis=per_token]", VIT_B, tokens) == per_token
        assert encoding_flops(string, VIT_B, tokens, device="cpu") == per_token
        assert encoding_flops(string, VIT_B, tokens) == rotation  # auto on CUDA
        assert encoding_flops(f"{string}[basis=folded]", VIT_B, tokens, device="cpu") == rotation


def test_cope_model_counts_its_gate_and_position_products_as_flop_counter_mode_does():
    """CoPE's two matrix products per layer: the gates' q . k (2 E per pair) and q . e[p] at every
    integer position (2 E npos_max per query; until stop 61 left out, half its matrix work);
    the model's remainder is its 12 elementwise operations per pair, which the counter skips."""
    from torch.utils.flop_counter import FlopCounterMode

    from pe_bench.adapters import Geometry, build
    from pe_bench.adapters.base import PositionLayout
    from pe_bench.harness.attention import Attention

    config = type(VIT_B)(dim=64, depth=1, num_heads=4, mlp_ratio=4.0)
    tokens, side = 17, 4
    encoding = build("cope", Geometry(pos_dim=2, grid_shape=(side, side), num_prefix_tokens=1), 64, 4, 1)
    layer = Attention(64, 4, encoding.make_layer(0)).eval()
    layout = encoding.prepare(PositionLayout.grid(1, (side, side), 1))
    x = torch.randn(1, tokens, 64)
    with torch.no_grad():
        with FlopCounterMode(display=False) as bare:
            Attention(64, 4).eval()(x, layout)
        with FlopCounterMode(display=False) as counted:
            layer(x, layout)
    extra_matmuls = counted.get_total_flops() - bare.get_total_flops()
    elementwise = 4 * tokens**2 * 12
    assert encoding_flops("cope", config, tokens) - elementwise == pytest.approx(extra_matmuls)


def test_sape2_model_counts_its_gate_and_table_products_as_flop_counter_mode_does():
    """SaPE²'s matrix products per layer: the gates' q . k (2 E per pair) and, per axis, the probe
    against its table at every integer position (2 E npos_max per query; until stop 64 left out);
    the model's remainder, 4 + 3 (W + H) per pair, is elementwise work the counter skips (the
    distances are computed without matrix products, compute_mode donot_use_mm)."""
    from torch.utils.flop_counter import FlopCounterMode

    from pe_bench.adapters import Geometry, build
    from pe_bench.adapters.base import PositionLayout
    from pe_bench.harness.attention import Attention, attention_kernel

    config = type(VIT_B)(dim=64, depth=1, num_heads=4, mlp_ratio=4.0)
    for side, npos_max in ((4, None), (5, 9)):
        tokens = side * side + 1
        geometry = Geometry(pos_dim=2, grid_shape=(side, side), num_prefix_tokens=1)
        encoding = build("sape2", geometry, 64, 4, 1, {"npos_max": npos_max})
        layer = Attention(64, 4, encoding.make_layer(0)).eval()
        layout = encoding.prepare(PositionLayout.grid(1, (side, side), 1))
        x = torch.randn(1, tokens, 64)
        with torch.no_grad(), attention_kernel("dense"):
            with FlopCounterMode(display=False) as bare:
                Attention(64, 4).eval()(x, layout)
            with FlopCounterMode(display=False) as counted:
                layer(x, layout)
        extra_matmuls = counted.get_total_flops() - bare.get_total_flops()
        elementwise = 4 * tokens**2 * (4 + 3 * 2 * side)
        method = "sape2" if npos_max is None else f"sape2[npos_max={npos_max}]"
        assert encoding_flops(method, config, tokens) - elementwise == pytest.approx(extra_matmuls)


def test_the_flop_model_counts_at_least_the_matrix_products_of_every_encoding():
    """The model's terms are the encoding's matrix products plus estimates of its elementwise
    work, so it can never count less than FlopCounterMode's matrix products (on the path the
    model describes: CPU, the dense bias; float32 and bf16 autocast, where PaPE's widened
    features carry the split). CoPE's q . e[p] (stop 61), SaPE²'s (stop 64) and WePE's
    Linear(4 -> D) (stop 64) were each missing and each fail this; where an encoding has no
    elementwise term to add (pape-ri), the two are equal."""
    from torch.utils.flop_counter import FlopCounterMode

    from pe_bench.harness.attention import attention_kernel

    spec = BenchSpec(model="tiny", methods=("nopos",))
    config, size = MODELS["tiny"]
    tokens = (size // config.patch_size) ** 2 + 1

    def counted(method: str, bf16: bool) -> int:
        model, size = bench._build_vit(method, spec)
        with (
            torch.inference_mode(),
            attention_kernel("dense"),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16),
            FlopCounterMode(display=False, custom_mapping=bench._EXTRA_FLOP_FORMULAS) as counter,
        ):
            model.eval()(torch.randn(1, 3, size, size))
        return counter.get_total_flops()

    for bf16 in (False, True):
        bare = counted("nopos", bf16)
        for method in THROUGHPUT_METHODS[1:]:
            matrix_products = counted(method, bf16) - bare
            modelled = encoding_flops(method, config, tokens, bf16=bf16, device="cpu")
            assert modelled >= matrix_products, (method, bf16, modelled, matrix_products)
        assert encoding_flops("pape-ri", config, tokens, bf16=bf16, device="cpu") == counted("pape-ri", bf16) - bare


def test_bench_command_prints_the_throughput_table_and_compiles_on_request(capsys, monkeypatch):
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compiled.append(type(self).__name__))
    args = ["bench", "--model", "tiny", "--methods", "nopos,alibi", "--repeats", "1", "--batch", "1"]
    assert main([*args, "--train-batch", "0", "--throughput", "--throughput-batch", "1,2", "--compile"]) == 0
    out = capsys.readouterr().out
    assert "train_img_s_b2_vs_bound" in out and "flop_bound" in out
    assert compiled and set(compiled) == {"ViT"}


def test_pape_precision_command_prints_its_table(capsys, monkeypatch):
    small = pape_precision.pape_precision_table(sides=(6,), methods=("pape-ri",), dim=64, heads=1, queries=8)
    monkeypatch.setattr(pape_precision, "pape_precision_table", lambda: small)
    assert main(["bench", "--pape-precision"]) == 0
    out = capsys.readouterr().out
    assert "bf16 split max" in out and "6x6" in out
    asked = []
    monkeypatch.setattr(pape_precision, "pape_precision_table", lambda **kw: asked.append(kw) or small)
    assert main(["bench", "--pape-precision", "--methods", "nopos,pape[space=position,m=8]"]) == 0
    assert asked == [{"methods": ("nopos", "pape[space=position,m=8]")}]


class _FakeTimm:
    """Stands in for timm (not a dependency): records what the reference row asks it for."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict]] = []

    def create_model(self, name: str, **kwargs) -> torch.nn.Module:
        self.asked.append((name, kwargs))
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(kwargs["num_classes"]))


def test_timm_reference_row_is_timms_model_of_the_same_shape_without_weights(monkeypatch):
    fake = _FakeTimm()
    monkeypatch.setitem(__import__("sys").modules, "timm", fake)
    monkeypatch.setitem(bench.MODELS, "vit-s", (bench.MODELS["vit-s"][0], 16))  # a small image keeps it quick
    seen = []
    table = throughput_table(_spec(model="vit-s", methods=("timm",), batches=(2,)), on_row=seen.append)
    assert fake.asked == [("vit_small_patch16_224", {"pretrained": False, "num_classes": 1000, "img_size": 16})]
    assert list(table.index) == ["nopos", "timm"] and [row["method"] for row in seen] == ["nopos", "timm"]
    assert table.loc["timm", "kernel"] == "vit_small_patch16_224"
    assert pd.isna(table.loc["timm", "flop_bound"])  # the FLOP model covers encodings, not timm
    assert isinstance(table.loc["timm", "train_img_s_b2_vs_nopos"], float)


def test_timm_row_without_timm_or_a_matching_model_is_a_row_not_a_crash(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "timm", None)  # import timm raises ImportError
    table = throughput_table(_spec(methods=("timm",)))
    assert table.loc["timm", "kernel"].startswith("error: no timm reference for --model tiny")
    table = throughput_table(_spec(model="vit-s", methods=("timm",), batches=(1,), image_size=16))
    assert "pip install timm" in table.loc["timm", "kernel"]


def test_bench_streams_throughput_rows_and_can_leave_the_forward_table_out(capsys):
    args = ["bench", "--model", "tiny", "--methods", "nopos,rope", "--repeats", "1", "--no-forward"]
    assert main([*args, "--throughput", "--throughput-batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "## Median ms" not in out
    rows = [line for line in out.splitlines() if line.startswith("row: ")]
    assert [__import__("json").loads(line[5:])["method"] for line in rows] == ["nopos", "rope"]


def test_bench_methods_keep_their_order_with_timm_among_them():
    from pe_bench.harness.cli import _bench_methods

    assert _bench_methods("timm, pape[m=8,form=explicit],rope,timm") == ("timm", "pape[m=8,form=explicit]", "rope")


def test_profile_step_names_the_operators_of_a_training_step(capsys):
    args = ["bench", "--model", "tiny", "--device", "cpu", "--profile-step", "nopos,rope", "--throughput-batch", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "## nopos: eager training step at batch 2" in out and "## rope: eager training step at batch 2" in out
    rope = out.split("## rope")[1]
    assert "Self CPU" in rope and "aten::mul" in rope  # the rotation's products are among rope's operators


def test_a_method_that_fails_to_profile_is_named_and_the_rest_profile(capsys, monkeypatch):
    """An OOM in one method's profile ended the command, losing the methods after it (on a GPU
    lent for minutes, the rest of the call)."""
    real = bench.profile_step

    def alibi_out_of_memory(method, spec, batch):
        if method == "alibi":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 25.90 GiB")
        return real(method, spec, batch)

    monkeypatch.setattr(bench, "profile_step", alibi_out_of_memory)
    args = ["bench", "--model", "tiny", "--profile-step", "alibi,nopos", "--throughput-batch", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "## alibi: eager training step at batch 2" in out and "not profiled: OOM" in out
    assert "Self CPU" in out.split("## nopos")[1]


def test_profile_step_profiles_the_compiled_step_with_compile(capsys, monkeypatch):
    """``--compile`` profiles the step of the model compiled as ``bench --compile`` times it
    (``aot_eager`` here, which keeps this quick: the compiled graph runs as one autograd
    function, ``CompiledFunction``, in the profile)."""
    from pe_bench.harness.compile import compile_model

    monkeypatch.setattr(bench, "compile_model", lambda model, **kw: compile_model(model, backend="aot_eager", **kw))
    torch._dynamo.reset()
    args = ["bench", "--model", "tiny", "--device", "cpu", "--profile-step", "rope", "--throughput-batch", "2"]
    assert main([*args, "--compile"]) == 0
    out = capsys.readouterr().out
    assert "## rope: compiled training step at batch 2" in out
    assert "CompiledFunction" in out


def test_every_model_of_a_compiled_table_runs_compiled(monkeypatch):
    """All models of a table run the same ViT code and stay alive (nopos pairs with every
    row): past Dynamo's default of 8 entries per code object (the third model, measured) a
    model would run uncompiled under the compiled label. Now the limit has room for them, and
    a model that still hit it would be its row's error; ``aot_eager`` keeps this quick."""
    from torch._dynamo.utils import counters

    from pe_bench.harness.compile import compile_model

    monkeypatch.setattr(bench, "compile_model", lambda model, **kw: compile_model(model, backend="aot_eager", **kw))
    torch._dynamo.reset()
    counters.clear()
    methods = ("rope", "sincos", "cape", "alibi")
    table = throughput_table(_spec(methods=methods, compile=True))
    for column in ("train_img_s_b1", "infer_img_s_b1", "train_img_s_b2", "infer_img_s_b2"):
        assert all(isinstance(value, float) for value in table[column]), table[column]
    # each model's training and evaluation graphs, at least: none of them ran uncompiled
    assert counters["stats"]["unique_graphs"] >= 2 * (1 + len(methods))


def test_compiled_table_specialises_every_model_to_its_batch(monkeypatch):
    """Dynamo decides automatic dynamic shapes per code object: once nopos ran at two batch
    sizes, the next model's first graph would have been compiled for any batch size, and the
    table would compare nopos's batch-specialised kernels with generic ones. Every graph the
    table compiles has static shapes."""
    from pe_bench.harness.compile import compile_model

    symbolic: list[bool] = []

    def recording_backend(graph, example_inputs):
        # a graph compiled for any batch size takes the size as an input of its own
        sizes = [x for x in example_inputs if isinstance(x, int | torch.SymInt)]
        shapes = [d for x in example_inputs for d in getattr(x, "shape", ())]
        symbolic.append(bool(sizes) or any(isinstance(d, torch.SymInt) for d in shapes))
        return graph.forward

    monkeypatch.setattr(
        bench, "compile_model", lambda model, **kw: compile_model(model, backend=recording_backend, **kw)
    )
    torch._dynamo.reset()
    table = throughput_table(_spec(methods=("rope", "sincos"), compile=True))
    assert all(isinstance(value, float) for value in table["train_img_s_b1"])
    assert len(symbolic) >= 3 * 4 and not any(symbolic)  # train/eval x batch 1/2, per model


def test_each_encoding_is_freed_before_the_next_is_built(monkeypatch):
    """A ViT-B table holds nopos (the pairs' reference) and the encoding being measured, not
    also the one before it: on a GPU that is another model with its optimiser states."""
    import gc
    import weakref

    built: list[weakref.ref] = []
    real = throughput._build_vit

    def build(method, spec):
        gc.collect()
        alive = [ref() is not None for ref in built[1:]]  # built[0] is nopos, which stays
        assert not any(alive), f"building {method} while an earlier encoding is alive"
        model, size = real(method, spec)
        built.append(weakref.ref(model))
        return model, size

    monkeypatch.setattr(throughput, "_build_vit", build)
    throughput_table(_spec(methods=("rope", "sincos", "alibi"), batches=(1,)))
    assert len(built) == 4


def _interrupt_at(monkeypatch, method: str) -> None:
    """Make the img/s table's measurement of ``method`` end as a deadline's SIGINT would."""
    real = throughput._measure_method

    def measure(name, spec, baseline):
        if name == method:
            raise KeyboardInterrupt
        return real(name, spec, baseline)

    monkeypatch.setattr(throughput, "_measure_method", measure)


def test_an_interrupted_table_reports_what_it_measured_and_names_the_rest(monkeypatch):
    """A GPU run's deadline (``timeout -s INT``) used to lose the whole table, its FLOP bounds
    and nopos's spread; the rows before it are the table now, nothing half-measured."""
    _interrupt_at(monkeypatch, "pape[m=4]")
    table = throughput_table(_spec(batches=(1,)))
    assert list(table.index) == ["nopos", "rope"]
    assert table.attrs["interrupted"] == ["pape[m=4]", "alibi"]
    assert table.loc["rope", "flop_bound"] > 0 and table.loc["rope", "train_img_s_b1_vs_bound"] > 0
    assert table.attrs["nopos_over_the_run"]["train_img_s_b1"]["calls"] == 2  # nopos's own and rope's pair


def test_a_table_interrupted_before_nopos_is_measured_is_no_table(monkeypatch):
    _interrupt_at(monkeypatch, "nopos")
    with pytest.raises(KeyboardInterrupt):
        throughput_table(_spec(batches=(1,)))


def test_bench_command_interrupted_prints_and_writes_the_rows_it_measured(capsys, monkeypatch, tmp_path):
    from pe_bench.harness.reports import sweep as sweep_module

    _interrupt_at(monkeypatch, "alibi")
    monkeypatch.setattr(sweep_module, "sweep_table", lambda *a, **k: pytest.fail("the sweep ran after a deadline"))
    args = ["bench", "--model", "tiny", "--methods", "nopos,rope,alibi", "--repeats", "1", "--no-forward"]
    code = main([*args, "--throughput", "--throughput-batch", "1", "--sweep", "64", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 130
    assert "interrupted before it measured: alibi" in out
    assert "nopos over the whole run" in out and "| rope " in out
    written = pd.read_csv(tmp_path / "bench_throughput.csv", index_col="method")
    assert list(written.index) == ["nopos", "rope"] and written.loc["rope", "flop_bound"] > 0


def test_a_compiled_table_compiles_nothing_inside_its_timed_calls(monkeypatch):
    """Dynamo guards compiled code on torch's CPU thread count: warmed up with the process's
    count and timed with ``--threads``'s, a compiled model compiled again inside its first
    timed calls (``bench --compile --threads 1`` on a 2-core CPU timed nopos at 0.6 img/s,
    rope at 280x nopos). The warm-up calls now run with the timed calls' threads."""
    from torch._dynamo.utils import counters

    from pe_bench.harness.compile import compile_model

    monkeypatch.setattr(bench, "compile_model", lambda model, **kw: compile_model(model, backend="aot_eager", **kw))
    compiled_in_timed_calls = []
    paired_timing = throughput.paired_timing

    def watched(*args, **kwargs):
        before = counters["stats"]["unique_graphs"]
        timing = paired_timing(*args, **kwargs)
        compiled_in_timed_calls.append(counters["stats"]["unique_graphs"] - before)
        return timing

    monkeypatch.setattr(throughput, "paired_timing", watched)
    threads = 1 if torch.get_num_threads() > 1 else 2  # not the process's count
    torch._dynamo.reset()
    counters.clear()
    throughput_table(_spec(methods=("rope",), batches=(2,), compile=True, threads=threads))
    assert compiled_in_timed_calls and set(compiled_in_timed_calls) == {0}, compiled_in_timed_calls
