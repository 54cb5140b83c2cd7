"""``benchmarks/sdpa_head_width.py`` (run by ``.ci/gpu profile``) runs and reports every width,
with v at the base width and as wide as q, on the CPU at a toy size."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sdpa_head_width.py"


def test_every_width_gets_its_kernels_times_and_ratios(capsys):
    spec = importlib.util.spec_from_file_location("sdpa_head_width", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    table = script.main(["--batch", "1", "--heads", "2", "--tokens", "5", "--widths", "8,16", "--repeats", "1"])
    assert [row["qk_width"] for row in table] == [8, 16]
    assert table[0]["vs_base"] == 1.0 and table[1]["vs_base"] > 0
    assert [row["qk_flops_vs_base"] for row in table] == [1.0, 1.5]  # q.k doubles, p.v stays
    assert all(row[f"{v}_ms"] > 0 and row[f"{v}_kernel"] for row in table for v in ("v_base", "v_same"))
    printed = capsys.readouterr().out
    assert "| qk_width |" in printed and printed.count("\n| 16 |") == 1
