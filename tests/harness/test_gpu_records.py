"""The README's GPU tables must be what the shipped GPU rows say: every img/s, ratio and peak
memory recomputed from ``benchmarks/gpu-*/throughput_rows.jsonl`` (the rows each run printed)
and compared with the README's line for that encoding in that run's section, and every
sweep point with ``sweep_rows.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pe_bench.harness.reports.bench import MODELS
from pe_bench.harness.reports.targets import load_run
from pe_bench.harness.reports.throughput import flop_bound

ROOT = Path(__file__).resolve().parents[2]
#: each GPU run's folder and the README heading of its section ("### On a GPU: <this>")
RUNS = {
    "gpu-h200-2026-11-26": "one NVIDIA H200, torch 2.11.0+cu130 (first measurement, 2026-11-26)",
    "gpu-h200-2026-11-27": "one NVIDIA H200, torch 2.11.0+cu130 (second measurement, 2026-11-27)",
    "gpu-h100-2026-11-28": "one NVIDIA H100 80GB HBM3, torch 2.11.0+cu130 (third measurement, 2026-11-28)",
}
README_NAMES = {"pape": "pape (m = 50)", "timm": "timm `vit_base_patch16_224`"}


def _gpu_run(run: str):
    """The run's ``run.json`` (harness/reports/targets.py): the form each row measured where a
    default changed since (``measured_as``: the STRINGs' per-token basis until stop 50, PaPE's
    projected space until stop 55), and the bound of a form the code has since replaced
    (``bounds``: Circulant-STRING's complex FFTs on the first H200 run)."""
    return load_run(ROOT / "benchmarks" / run)


def _section(run: str) -> str:
    """The README's text of ``run``'s "On a GPU" section, up to the next heading."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index(f"### On a GPU: {RUNS[run]}")
    end = readme.find("\n#", start + 1)
    return readme[start : end if end > 0 else None]


def _readme_row(run: str, label: str) -> list[str]:
    lines = [line for line in _section(run).splitlines() if line.startswith(f"| {label} |")]
    # the GPU table's lines: 11 cells or more, and a kernel (not a grid, as the bf16 table's) second
    gpu = [line for line in lines if "img/s" not in line and line.count("|") >= 11 and "²" not in line.split("|")[2]]
    assert len(gpu) == 1, f"the README's GPU table of {run} has {len(gpu)} lines for {label!r}"
    # "‖" marks a figure the README explains below the table (relpos's unfused inference)
    return [cell.replace("‖", "").strip() for cell in gpu[0].strip("|").split("|")]


def _rows(run: str, name: str = "throughput_rows.jsonl") -> list[dict]:
    return [json.loads(line) for line in (ROOT / "benchmarks" / run / name).read_text().splitlines()]


def _cases() -> list[tuple[str, dict]]:
    return [(run, row) for run in RUNS for row in _rows(run)]


@pytest.mark.parametrize(("run", "row"), _cases(), ids=lambda case: case if isinstance(case, str) else case["method"])
def test_readme_gpu_table_is_the_shipped_rows(run, row):
    cells = _readme_row(run, README_NAMES.get(row["method"], row["method"]))
    if "train_img_s_b128" not in row:  # a failed measurement: the README names the error
        assert cells[1].startswith("error:") and row["kernel"].split(". ")[0].removeprefix("error: ") in cells[1]
        return
    nopos = next(r for r in _rows(run) if r["method"] == "nopos")
    train, infer = row["train_img_s_b128"], row["infer_img_s_b128"]
    assert cells[2] == f"{train:.0f}" and cells[6] == f"{infer:.0f}"
    if "train_img_s_b128_vs_nopos" in row:  # paired with nopos's calls (since stop 47): the run's own ratio
        train_ratio, infer_ratio = row["train_img_s_b128_vs_nopos"], row["infer_img_s_b128_vs_nopos"]
        iqr = row.get("train_img_s_b128_vs_nopos_iqr")
        assert cells[3] == f"{train_ratio:.2f}" + ("" if iqr is None else f" ({iqr:.3f})")
    else:  # the first run: medians measured minutes apart
        train_ratio, infer_ratio = nopos["train_img_s_b128"] / train, nopos["infer_img_s_b128"] / infer
        assert cells[3] == f"{train_ratio:.2f}"
    assert cells[7] == f"{infer_ratio:.2f}"
    assert cells[8] == f"{row['train_peak_mib'] / 1024:.1f}"
    if row["method"] != "timm":
        gpu_run = _gpu_run(run)
        measured = gpu_run.measured_as(row["method"])
        bound = gpu_run.bounds.get(row["method"]) or flop_bound(measured, MODELS["vit-b"][0], 224)
        assert cells[4] == f"{bound:.3f}"
        assert cells[5] == f"{train_ratio / bound:.2f}"


@pytest.mark.parametrize("run", RUNS)
def test_readme_sweep_points_are_the_shipped_ones(run):
    section = _section(run)
    for point in _rows(run, "sweep_rows.jsonl"):
        assert f"{point['peak_mib']:,.0f} MiB / {point['ms']:,.1f} ms" in section, point


def test_readme_compiled_figures_are_the_shipped_rows():
    """The second run's compiled rows (nopos, rope) as the README states them."""
    run = "gpu-h200-2026-11-27"
    section = _section(run)
    rows = {row["method"]: row for row in _rows(run, "compiled_rows.jsonl")}
    nopos, rope = rows["nopos"], rows["rope"]
    assert f"nopos {nopos['train_img_s_b128']:.0f} train / {nopos['infer_img_s_b128']:.0f} inference" in section
    eager_nopos = next(r for r in _rows(run) if r["method"] == "nopos")
    assert f"{nopos['train_img_s_b128'] / eager_nopos['train_img_s_b128']:.2f}× its eager" in section
    assert f"rope: {rope['train_img_s_b128']:.0f} img/s, **{rope['train_img_s_b128_vs_nopos']:.2f}×**" in section
    assert f"(IQR {rope['train_img_s_b128_vs_nopos_iqr']:.3f}) and {rope['infer_img_s_b128_vs_nopos']:.2f}×" in section
