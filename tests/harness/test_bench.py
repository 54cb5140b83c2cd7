"""The benchmark command's structure (figures are printed, never asserted: machines are noisy)."""

from __future__ import annotations

import pandas as pd
import torch

from pe_bench.harness.cli import main
from pe_bench.harness.reports import bench as bench_module
from pe_bench.harness.reports import sweep as sweep_module
from pe_bench.harness.reports.bench import BenchSpec, _build_vit, forward_table, sdpa_backend
from pe_bench.harness.reports.sweep import sweep_markdown, sweep_table


def test_forward_table_is_relative_to_nopos_and_counts_positional_parameters():
    spec = BenchSpec(model="tiny", methods=("rope", "pape[m=4]", "abspos", "alibi"), batches=(1, 4), train_batch=2)
    table = forward_table(BenchSpec(**{**spec.__dict__, "repeats": 1}))
    assert list(table.index) == ["nopos", "rope", "pape[m=4]", "abspos", "alibi"]
    for column in ("infer_ms_per_image_b1", "infer_ms_per_image_b4", "train_step_ms_b2"):
        assert table.loc["nopos", f"{column}_vs_nopos"] == 1.0 and (table[column] > 0).all()
        assert (table[f"{column}_iqr"] >= 0).all()  # the spread beside each median
    # FLOPs of the tiny ViT (d 64, 4 layers, 4 heads, MLP 128, 36 patches + CLS, 1000 classes):
    # patch embedding + (qkv, projection, MLP) per layer + head + attention's two products.
    tokens, dim = 37, 64
    matmuls = 2 * 36 * 48 * dim + 4 * 2 * tokens * dim * (3 * dim + dim + 2 * 128) + 2 * dim * 1000
    attention = 4 * 2 * 2 * tokens * tokens * dim
    assert table.loc["nopos", "gflops_per_image"] == round((matmuls + attention) / 1e9, 4)
    assert table.loc["rope", "gflops_per_image"] == table.loc["nopos", "gflops_per_image"]  # rotation: elementwise
    assert table.loc["pape[m=4]", "gflops_per_image"] > table.loc["nopos", "gflops_per_image"]  # wider q/k
    # fused-kernel encodings reach a fused kernel (CPU flash also takes ALiBi's float bias,
    # which is still an N x N tensor: the bias, not the kernel, decides the memory)
    backends = {"FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "OVERRIDEABLE", "MATH"}
    assert all(set(choice.split(" (training: ")[0].split("+")) <= backends for choice in table["sdpa"])
    assert "MATH" not in table.loc["rope", "sdpa"] and "MATH" not in table.loc["pape[m=4]", "sdpa"]
    assert table.loc["rope", "pos_params"] == 0 and table.loc["nopos", "pos_params"] == 0
    # PaPE per layer: W_a, W_b (2 m H d) + W_p (H m P); tiny ViT: d 64, H 4, depth 4, P 2.
    assert table.loc["pape[m=4]", "pos_params"] == 4 * (2 * 4 * 4 * 64 + 4 * 4 * 2)
    assert table.loc["abspos", "pos_params"] == 64 * 6 * 6
    assert (table["peak_mib"] > 0).all()  # a fresh process holds at least the weights
    # bytes a bf16 training step at batch 2 writes: PaPE's widened q/k and features add to nopos's
    written = table["written_mib_train_b2_bf16"]
    assert written["nopos"] > 0 and written["pape[m=4]"] > written["rope"] >= written["nopos"]


def test_sweep_measures_each_point_in_a_fresh_process():
    sweep = sweep_table(["nopos", "pape[form=explicit]"], [64], dim=32, heads=4).set_index("method")
    assert (sweep["status"] == "ok").all()
    assert sweep.loc["nopos", "peak_mib"] >= 0 and sweep.loc["pape[form=explicit]", "ms"] > 0
    assert "MiB /" in sweep_markdown(sweep.reset_index())


def test_the_sweep_estimates_each_explicit_forms_dense_bias_by_its_own_values_per_pair():
    """The dense Eq. 9 bias the sweep skips past its budget: PaPE's m differences per pair,
    PaPE-RI's one squared distance (not PaPE's default m = 50), nothing for other forms."""
    from pe_bench.harness.reports.sweep import _explicit_pape_bytes

    assert _explicit_pape_bytes("pape[form=explicit]", 100, 2) == 4.0 * 100 * 100 * 2 * 52
    assert _explicit_pape_bytes("pape[form=explicit,m=4]", 100, 2) == 4.0 * 100 * 100 * 2 * 6
    assert _explicit_pape_bytes("pape-ri[form=explicit]", 100, 2) == 4.0 * 100 * 100 * 2 * 3
    assert _explicit_pape_bytes("pape", 100, 2) == _explicit_pape_bytes("pape-ri", 100, 2) == 0.0
    assert _explicit_pape_bytes("alibi", 100, 2) == 0.0


def test_sweep_reports_a_failed_or_skipped_point_in_the_table(monkeypatch):
    """A point that dies (out of memory, a kernel error) is a table entry with its reason, and
    the other points are still measured."""
    real = sweep_module._run_child

    def run_child(code: str):
        if "'alibi'" in code:
            return real("import torch; torch.empty(1, device='meta').item()")  # a kernel that fails
        if "'rope'" in code:
            return real("raise MemoryError('CPU out of memory: tried to allocate 64 GiB')")
        return real(code)

    monkeypatch.setattr(sweep_module, "_run_child", run_child)
    monkeypatch.setattr(sweep_module, "EXPLICIT_BUDGET", 1)
    streamed = []
    methods = ["nopos", "alibi", "rope", "pape[form=explicit]"]
    sweep = sweep_table(methods, [16], dim=16, heads=2, on_row=streamed.append)
    # each point is reported as it ends, failures too
    assert [(r["method"], r["status"]) for r in streamed] == list(zip(sweep["method"], sweep["status"], strict=True))
    status = dict(zip(sweep["method"], sweep["status"], strict=True))
    assert status["nopos"] == "ok"
    assert status["rope"] == "OOM"
    assert status["alibi"].startswith("error: ") and "meta" in status["alibi"]
    assert status["pape[form=explicit]"].startswith("skipped: dense bias")
    assert sweep.set_index("method").loc["alibi", ["peak_mib", "ms"]].isna().all()
    markdown = sweep_markdown(sweep)
    assert "OOM" in markdown and "skipped" in markdown


def test_bench_command_prints_the_table(capsys):
    threads = torch.get_num_threads()
    assert main(["bench", "--model", "tiny", "--methods", "nopos,rope", "--repeats", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "infer_ms_per_image_b32_vs_nopos" in out and "train_step_ms_b32" in out and "device:" in out
    assert "train_step_ms_b32_iqr" in out and "gflops_per_image" in out and "torch threads: 1" in out
    assert torch.get_num_threads() == threads  # the timer restores the setting


def test_an_interrupted_sweep_keeps_its_points_and_names_the_rest(monkeypatch):
    real = sweep_module._measure_point

    def measure(tokens, method, *args):
        if method == "alibi":
            raise KeyboardInterrupt  # a deadline's SIGINT while this point's child runs
        return real(tokens, method, *args)

    monkeypatch.setattr(sweep_module, "_measure_point", measure)
    streamed = []
    sweep = sweep_table(["nopos", "alibi", "rope"], [16, 32], dim=16, heads=2, on_row=streamed.append)
    assert list(sweep["method"]) == ["nopos"] and streamed == sweep.to_dict("records")
    assert sweep.attrs["interrupted"] == ["alibi at 16 tokens", "rope at 16 tokens", "nopos at 32 tokens",
                                          "alibi at 32 tokens", "rope at 32 tokens"]  # fmt: skip
    assert "MiB /" in sweep_markdown(sweep)


def test_the_kernel_column_names_the_training_forwards_kernel_where_it_differs():
    """A bias that requires grad is another input to SDPA's choice: CPU's flash kernel takes
    none, so relpos (a learned table) trains on MATH while it infers on FLASH_ATTENTION; a
    fixed bias (alibi) and no bias (rope) keep one kernel. The model is left in eval mode."""
    kernels = {}
    for method in ("rope", "alibi", "relpos"):
        model, size = _build_vit(method, BenchSpec(model="tiny"))
        kernels[method] = sdpa_backend(model, torch.randn(2, 3, size, size), "cpu")
        assert not model.training
    assert kernels == {
        "rope": "FLASH_ATTENTION",
        "alibi": "FLASH_ATTENTION",
        "relpos": "FLASH_ATTENTION (training: MATH)",
    }


def test_sdpa_backend_probes_a_compiled_model_eagerly():
    """``bench --compile``'s forward table names the kernels of compiled models too: the probe
    runs them eagerly (torch 2.14's Dynamo failed with an internal error tracing the probe's
    spy, so every compiled forward table failed)."""
    from pe_bench.adapters import EncodingFactory
    from pe_bench.harness.compile import compile_model
    from pe_bench.harness.config import ModelConfig
    from pe_bench.tasks._shared.vit import ViT, image_geometry

    config = ModelConfig(dim=32, depth=2, num_heads=4, mlp_ratio=2.0, patch_size=4)
    model = ViT(EncodingFactory("nopos", {}), image_geometry((16, 16), 4), config, 3, 10).eval()
    torch._dynamo.reset()
    compile_model(model, backend="aot_eager", dynamic=False)
    assert sdpa_backend(model, torch.randn(1, 3, 16, 16), "cpu") == "FLASH_ATTENTION"
    torch._dynamo.reset()


def test_a_device_this_machine_lacks_is_a_one_line_error(capsys, monkeypatch):
    """--device cuda without a GPU, or a misspelt device, says so before any model is built
    (it was torch's traceback from the first CUDA call)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--device", "cuda", "--methods", "nopos"]) == 2
    assert "no usable CUDA device" in capsys.readouterr().err
    assert main(["bench", "--device", "gpu", "--methods", "nopos"]) == 2
    assert "not a device; use cpu, cuda or cuda:N" in capsys.readouterr().err


def test_a_sweep_token_count_that_is_no_square_is_refused_naming_squares(capsys):
    """The layer's grid is side x side: 1000 tokens ran 961 under the label 1000."""
    assert main(["bench", "--model", "tiny", "--methods", "nopos", "--sweep", "1024,1000", "--no-forward"]) == 2
    err = capsys.readouterr().err
    assert "token counts must be squares" in err and "1000 (e.g. 961 or 1024)" in err


def test_gflops_are_counted_in_the_dtype_the_timed_passes_run():
    """On CUDA the timed passes run under bf16 autocast, where PaPE's widened features carry
    the split (hi and lo columns): more FLOPs than in float32. Counted here under CPU autocast."""
    from pe_bench.harness.reports.bench import flops_per_image

    spec = BenchSpec(model="tiny", methods=("pape",))
    counts = {}
    for method in ("nopos", "rope", "pape"):
        model, size = _build_vit(method, spec)
        counts[method] = (flops_per_image(model, size, "cpu"), flops_per_image(model, size, "cpu", torch.bfloat16))
    assert counts["nopos"][0] == counts["nopos"][1] and counts["rope"][0] == counts["rope"][1]
    assert counts["pape"][1] > counts["pape"][0] > counts["nopos"][0]


def test_a_forward_table_measurement_that_fails_is_a_cell_not_a_crash(monkeypatch):
    """An encoding out of memory at the large batch (on a GPU: alibi's N x N bias) was a crash of
    the whole command that lost every other method's row. Now the cell says OOM, its ratio stays
    empty, the rest of its row and the other rows are measured; a method that cannot be built is
    a row whose kernel cell names the error."""
    real = bench_module._inference

    def rope_out_of_memory_at_batch_4(model, images, device):
        if images.shape[0] == 4 and model.encoding.name == "rope":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return real(model, images, device)

    monkeypatch.setattr(bench_module, "_inference", rope_out_of_memory_at_batch_4)
    spec = BenchSpec(model="tiny", methods=("rope", "pape[nonsense=1]"), batches=(1, 4), train_batch=2, repeats=2)
    table = forward_table(spec)
    assert list(table.index) == ["nopos", "rope", "pape[nonsense=1]"]
    assert table.loc["rope", "infer_ms_per_image_b4"] == "OOM"
    assert pd.isna(table.loc["rope", "infer_ms_per_image_b4_vs_nopos"])
    assert float(table.loc["nopos", "infer_ms_per_image_b4"]) > 0  # nopos's own b4 is measured
    assert float(table.loc["rope", "infer_ms_per_image_b1"]) > 0 and table.loc["rope", "train_step_ms_b2"] > 0
    assert table.loc["rope", "gflops_per_image"] == table.loc["nopos", "gflops_per_image"]
    unbuilt = table.loc["pape[nonsense=1]", "sdpa"]
    assert unbuilt.startswith("error:") and "nonsense" in unbuilt
    assert pd.isna(table.loc["pape[nonsense=1]", "infer_ms_per_image_b1"])
