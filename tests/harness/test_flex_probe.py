"""``bench --flex-probe``: the captured call is the core's, and each variant computes what its
name says (eager Flex here: compiling every variant would take minutes on this CPU)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from pe_bench.harness.cli import main
from pe_bench.harness.reports import flex_probe


@pytest.fixture
def eager_flex(monkeypatch):
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr("pe_bench.adapters._flex._compiled_flex_attention", lambda: flex_attention)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


def test_probe_rows_compute_what_they_name(eager_flex):
    torch.manual_seed(0)
    table = flex_probe.flex_probe_table(["alibi", "relpos"], 64, "cpu", repeats=1, dim=32, heads=4)
    variants = [
        "sdpa (no bias)",
        "flex, no score_mod",
        "flex, hand ALiBi",
        "flex, pe-bench alibi",
        "flex, pe-bench relpos",
    ]
    assert list(table["variant"]) == variants * 2
    assert list(table["layout"].unique()) == ["strided (as the core passes them)", "contiguous"]
    diff = table.set_index(["layout", "variant"])["max_diff_vs_pe_bench"]
    for layout in table["layout"].unique():
        # the hand-written ALiBi is pe-bench's function on a grid: like is timed against like
        assert diff[layout, "flex, hand ALiBi"] < 1e-5 and diff[layout, "flex, pe-bench alibi"] < 1e-5
        # without a score_mod, or with relpos's, the outputs differ, and the column shows it
        assert diff[layout, "flex, no score_mod"] > 1e-3 and diff[layout, "flex, pe-bench relpos"] > 1e-3
        assert diff[layout, "sdpa (no bias)"] > 1e-3
    sdpa = table[table["variant"] == "sdpa (no bias)"]
    assert (sdpa["x_sdpa"] == 1.0).all() and (table["ms"] > 0).all()


def test_the_captured_call_is_the_cores(eager_flex):
    """The probe's pe-bench row runs the arguments the layer passes to run_flex: strided views of
    the qkv projection (the layout it compares), the core's score_mod and scale."""
    call = flex_probe.capture_flex_call("alibi", 64, "cpu", dim=32, heads=4)
    assert call.q.shape == (1, 4, 64, 8) and not call.q.is_contiguous()
    assert call.scale == pytest.approx(8**-0.5) and call.score_mod is not None


def test_probe_refuses_what_it_cannot_measure(eager_flex):
    with pytest.raises(ValueError, match="square"):
        flex_probe.flex_probe_table(["alibi"], 60, "cpu", dim=32, heads=4)
    with pytest.raises(ValueError, match="--flex-probe nopos: its layer made 0 FlexAttention calls"):
        flex_probe.capture_flex_call("nopos", 64, "cpu", dim=32, heads=4)


def test_cli_prints_the_probe(eager_flex, monkeypatch, capsys, tmp_path):
    full = flex_probe.flex_probe_table

    def small(methods, tokens, device, repeats):
        return full(methods, tokens, device, repeats, dim=32, heads=4)

    monkeypatch.setattr(flex_probe, "flex_probe_table", small)
    argv = ["bench", "--device", "cpu", "--flex-probe", "64", "--repeats", "1", "--out", str(tmp_path)]
    # the probe runs Flex itself and times no training step: --attention-kernel flex is no conflict
    assert main([*argv, "--methods", "lookhere", "--attention-kernel", "flex"]) == 0
    out = capsys.readouterr().out
    assert "FlexAttention call at 64 tokens" in out and "flex, pe-bench lookhere" in out
    assert (tmp_path / "flex_probe.csv").read_text().count("flex, pe-bench lookhere") == 2


def test_readme_probe_figures_are_the_shipped_ones():
    """The README's table of the CPU probe is the CSV in benchmarks/, rounded to the ms."""
    import pandas as pd

    root = Path(__file__).resolve().parents[2]
    table = pd.read_csv(root / "benchmarks" / "cpu-flex-probe-2026-11-28" / "flex_probe.csv")
    readme = (root / "README.md").read_text()
    names = {
        "sdpa (no bias)": "SDPA, no bias",
        "flex, no score_mod": "Flex, no score_mod",
        "flex, hand ALiBi": "Flex, hand-written ALiBi",
        "flex, pe-bench alibi": "Flex, pe-bench alibi",
        "flex, pe-bench relpos": "Flex, pe-bench relpos",
    }
    for variant, label in names.items():
        ms = table[table["variant"] == variant].set_index("layout")["ms"]
        strided, contiguous = ms["strided (as the core passes them)"], ms["contiguous"]
        assert f"| {label} | {strided:,.0f} | {contiguous:,.0f} |" in readme, label
