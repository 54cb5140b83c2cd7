"""The benchmark command's structure (figures are printed, never asserted: machines are noisy)."""

from __future__ import annotations

from pe_bench.harness.bench import BenchSpec, forward_table, sweep_table
from pe_bench.harness.cli import main


def test_forward_table_is_relative_to_nopos_and_counts_positional_parameters():
    table = forward_table(BenchSpec(model="tiny", methods=("rope", "pape[m=4]", "abspos"), repeats=1))
    assert list(table.index) == ["nopos", "rope", "pape[m=4]", "abspos"]
    assert table.loc["nopos", "vs_nopos"] == 1.0
    assert table.loc["rope", "pos_params"] == 0 and table.loc["nopos", "pos_params"] == 0
    # PaPE per layer: W_a, W_b (2 m H d) + W_p (H m P); tiny ViT: d 64, H 4, depth 4, P 2.
    assert table.loc["pape[m=4]", "pos_params"] == 4 * (2 * 4 * 4 * 64 + 4 * 4 * 2)
    assert table.loc["abspos", "pos_params"] == 64 * 6 * 6
    assert (table["peak_mib"] > 0).all()  # a fresh process holds at least the weights


def test_sweep_measures_each_point_in_a_fresh_process():
    sweep = sweep_table(["nopos", "pape[form=explicit]"], [64], dim=32, heads=4)
    assert sweep.loc[64, ("peak_mib", "nopos")] >= 0 and sweep.loc[64, ("ms", "pape[form=explicit]")] > 0


def test_bench_command_prints_the_table(capsys):
    assert main(["bench", "--model", "tiny", "--methods", "nopos,rope", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "vs_nopos" in out and "device:" in out
