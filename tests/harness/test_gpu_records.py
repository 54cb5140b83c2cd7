"""The README's GPU table must be what the shipped GPU rows say: every img/s, ratio and
peak memory recomputed from ``benchmarks/gpu-*/throughput_rows.jsonl`` (the rows the run
printed) and compared with the README's line for that encoding, and every sweep point with
``sweep_rows.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pe_bench.harness.reports.bench import MODELS
from pe_bench.harness.reports.throughput import flop_bound

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "gpu-h200-2026-11-26"
README_NAMES = {"pape": "pape (m = 50)", "timm": "timm `vit_base_patch16_224`"}
#: rows measured with a form of the encoding the code has since replaced, with the FLOP-model
#: bound of the measured form: Circulant-STRING ran with complex FFTs on the H200 (stop 39) and
#: runs as a Fourier-basis matrix product since stop 41 (README, below the GPU table)
MEASURED_FORM_BOUNDS = {"string-circulant": 1.004}


def _readme_row(label: str) -> list[str]:
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(f"| {label} |")]
    # the GPU table's lines: 11 cells or more, and a kernel (not a grid, as the bf16 table's) second
    gpu = [line for line in lines if "img/s" not in line and line.count("|") >= 11 and "²" not in line.split("|")[2]]
    assert len(gpu) == 1, f"the README's GPU table has {len(gpu)} lines for {label!r}"
    # "‖" marks a figure the README explains below the table (relpos's unfused inference)
    return [cell.replace("‖", "").strip() for cell in gpu[0].strip("|").split("|")]


def _rows() -> list[dict]:
    return [json.loads(line) for line in (RUN / "throughput_rows.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row["method"])
def test_readme_gpu_table_is_the_shipped_rows(row):
    cells = _readme_row(README_NAMES.get(row["method"], row["method"]))
    if "train_img_s_b128" not in row:  # a failed measurement: the README names the error
        assert cells[1].startswith("error:") and row["kernel"].split(". ")[0].removeprefix("error: ") in cells[1]
        return
    nopos = next(r for r in _rows() if r["method"] == "nopos")
    train, infer = row["train_img_s_b128"], row["infer_img_s_b128"]
    assert cells[2] == f"{train:.0f}" and cells[6] == f"{infer:.0f}"
    assert cells[3] == f"{nopos['train_img_s_b128'] / train:.2f}"
    assert cells[7] == f"{nopos['infer_img_s_b128'] / infer:.2f}"
    assert cells[8] == f"{row['train_peak_mib'] / 1024:.1f}"
    if row["method"] != "timm":
        bound = MEASURED_FORM_BOUNDS.get(row["method"]) or flop_bound(row["method"], MODELS["vit-b"][0], 224, bf16=True)
        assert cells[4] == f"{bound:.3f}"
        assert cells[5] == f"{nopos['train_img_s_b128'] / train / bound:.2f}"


def test_readme_sweep_points_are_the_shipped_ones():
    readme = (ROOT / "README.md").read_text()
    for line in (RUN / "sweep_rows.jsonl").read_text().splitlines():
        point = json.loads(line)
        assert f"{point['peak_mib']:.0f} MiB / {point['ms']:.1f} ms" in readme, point
