"""Issue 16's GPU targets judged from the rows GPU runs printed (``pe-bench bench --targets``).

A GPU run is a folder (``benchmarks/gpu-*``, or the ``$OUT`` of a ``.ci/gpu`` call) holding
what ``bench`` printed: ``throughput_rows.jsonl`` (else the ``row:`` lines of ``ROW_FILES``, the
eager tables with the default kernels; ``eager-unfused.txt``, ``kernels-*.txt`` and
``compiled.txt`` time other forms and are not read), ``sweep_rows.jsonl`` (else the ``sweep:``
lines of ``sweep*.txt``), and ``run.json`` naming the GPU, the torch release
and the code measured. Each target is judged on the newest run that measured its encoding, and
the table says which run that was, in which form the encoding ran (``measured_as``: a run
before a default changed timed another form than today's), and which changes to the
encoding's CUDA path landed after that run (``CUDA_CHANGES``), so a figure of older code is
never read as today's.

Why a module and not a paragraph: the README's statement of every target was written by hand
from a run's rows until stop 60; now the table is made from the rows (and a test compares the
README's copy with it), so it cannot drift from what was measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import pandas as pd

from pe_bench.adapters.registry import available

Measure = Literal["timm", "ratio", "bound", "long-sequence"]
#: the token count of issue 16's long-sequence target: one attention layer without error
LONG_SEQUENCE_TOKENS = 65_536
#: the files of a ``.ci/gpu`` call whose ``row:`` lines are eager rows with the default kernels
#: (``session``: eager.txt; ``profile``: eager-rest.txt; ``throughput``: throughput.txt)
ROW_FILES = ("eager.txt", "eager-rest.txt", "throughput.txt")


@dataclass(frozen=True)
class Target:
    """One of issue 16's targets: ``measure`` of each of ``methods`` against ``limit``.

    * ``timm``: nopos's training img/s over timm's ViT-B/16's in the same run, at least ``limit``;
    * ``ratio``: the encoding's training step time over nopos's (batch 128), at most ``limit``;
    * ``bound``: that ratio over the encoding's FLOP-model bound (``throughput.flop_bound``), at most ``limit``;
    * ``long-sequence``: one attention layer at ``limit`` tokens runs, in less memory than one
      head's N x N scores in 16 bits (N² · 2 bytes, 8 GiB at 65,536 tokens): no N x N tensor."""

    name: str
    methods: tuple[str, ...]
    measure: Measure
    limit: float


def _bound_methods() -> tuple[str, ...]:
    """Every registered encoding but nopos (whose bound is itself), and PaPE at m = 8."""
    names = [name for name in available() if name != "nopos"]
    return (*names, "pape[m=8]")


def targets() -> tuple[Target, ...]:
    """Issue 16's targets (ViT-B/16 at 224², bf16 autocast, batch 128 training), in its order."""
    return (
        Target("nopos ≥ timm's ViT-B/16", ("timm",), "timm", 1.0),
        Target("≤ 1.10× nopos", ("rope", "rope-mixed", "string-cayley", "string-circulant"), "ratio", 1.10),
        Target("≤ 1.35× nopos", ("pape",), "ratio", 1.35),
        Target("≤ 1.25× nopos", ("alibi", "lookhere", "relpos"), "ratio", 1.25),
        Target("≤ 1.15× FLOP bound", _bound_methods(), "bound", 1.15),
        Target(
            "65,536 tokens, linear memory",
            ("alibi", "lookhere", "relpos", "cope", "sape2", "pape[form=explicit]"),
            "long-sequence",
            LONG_SEQUENCE_TOKENS,
        ),
    )


@dataclass(frozen=True)
class Change:
    """A change to encodings' CUDA path (their default there), with the commit that made it."""

    commit: str
    committed: str  # ISO 8601, the commit's committer date (a test checks both against git)
    stop: int
    what: str
    methods: tuple[str, ...]


_PAPES = ("pape", "pape[m=8]")
_STRINGS = ("string-cayley", "string-circulant")
#: what changed in the encodings' CUDA defaults since the GPU runs, from the second run's code on
#: (``LISTED_FROM``); the first run (11-26) is older, and of its rows only abspos's and sape2's are
#: the newest of their encoding
CUDA_CHANGES = (
    Change("72ee73d", "2026-11-27T20:40:02+00:00", 49, "the split's lo without a float32 copy", (*_PAPES, "pape-ri")),
    Change("e449b5e", "2026-11-27T20:45:49+00:00", 49, "two passes fewer in the features", _PAPES),
    Change("a2a10ca", "2026-11-27T22:32:36+00:00", 50, "rotation tables padded to the head", ("string-circulant",)),
    Change("b523888", "2026-11-27T22:40:55+00:00", 50, "basis folded into the q/k projections", _STRINGS),
    Change("9f97f2c", "2026-11-28T01:29:29+00:00", 51, "the fused rotation", ("rope", "rope-mixed", *_STRINGS)),
    Change("240b2f0", "2026-11-28T01:31:16+00:00", 51, "solve_ex (no host sync)", ("string-cayley",)),
    Change(
        "fe0613f",
        "2026-11-28T04:18:07+00:00",
        52,
        "heads split by unbind",
        (*_PAPES, "pape-ri", "relpos", *_STRINGS, "cope", "sape2"),
    ),
    Change("dad31ff", "2026-11-28T04:42:36+00:00", 52, "key ranks sorted once per forward", ("cope",)),
    Change("1831f74", "2026-11-28T18:05:14+00:00", 55, "position space", _PAPES),
    Change("fbede85", "2026-11-28T21:06:19+00:00", 56, "a kept token-major", _PAPES),
    Change("ff1c84f", "2026-11-28T23:40:44+00:00", 57, "the fused bias", ("cope",)),
    Change("dc37e7c", "2026-11-29T01:37:42+00:00", 58, "one batched solve per forward", ("string-cayley",)),
    Change("083754a", "2026-11-29T01:59:46+00:00", 58, "the fused widening", (*_PAPES, "pape-ri")),
    Change("b0aea53", "2026-11-29T04:20:12+00:00", 59, "position-only inputs once per forward", ("sape2",)),
    Change("d6d0a96", "2026-11-29T04:23:25+00:00", 59, "two passes fewer over the bias", ("lookhere",)),
    Change("5b9c1a6", "2026-12-01T22:07:07+00:00", 61, "angles in float32 under autocast", ("rope-mixed", *_STRINGS)),
    Change("5b9c1a6", "2026-12-01T22:07:07+00:00", 61, "phases in float32, the stream in bf16", ("sincos", "cape")),
    Change(
        "d595157", "2026-12-01T22:41:46+00:00", 61, "position-free tokens left out by where",
        ("rope", "rope-mixed", *_STRINGS, *_PAPES, "pape-ri", "cape"),
    ),  # fmt: skip
    Change(
        "bc968f2", "2026-12-02T07:10:01+00:00", 63, "position-free coordinates zeroed by where",
        ("rope", "rope-mixed", *_STRINGS, "sincos", "cape", "wepe"),
    ),  # fmt: skip
)

#: the code of the second GPU run (d05085a): ``CUDA_CHANGES`` lists what changed after it
LISTED_FROM = "2026-11-27T17:20:36+00:00"
#: what the table says of a run older than ``LISTED_FROM``
EARLIER_CHANGES = "changes before stop 49 (not listed)"


@dataclass
class GpuRun:
    """One GPU run's folder: its rows and what it measured (``run.json``)."""

    folder: Path
    gpu: str
    torch: str
    date: str
    code: str
    code_committed: str  # ISO 8601: changes committed later were not measured
    rows: list[dict] = field(default_factory=list)
    sweep: list[dict] = field(default_factory=list)
    #: method label -> the spec of the form that ran (a default changed since)
    measured_as_specs: dict[str, str] = field(default_factory=dict)
    #: method label -> the FLOP-model bound of a form the code no longer has
    bounds: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.gpu.removeprefix('NVIDIA ')} {self.date} ({self.code})"

    def measured_as(self, method: str) -> str:
        return self.measured_as_specs.get(method, method)

    def row(self, method: str) -> dict | None:
        return next((row for row in self.rows if row["method"] == method), None)

    def train_ratio(self, row: dict) -> float | None:
        """The row's training step time over nopos's: the run's paired ratio (since stop 47),
        else (the first run) the ratio of the two medians."""
        if not _measured(row.get("train_img_s_b128")):
            return None  # absent, or a failure's text ("OOM", "error: ...") in the training cell
        if "train_img_s_b128_vs_nopos" in row:
            return row["train_img_s_b128_vs_nopos"] if _measured(row["train_img_s_b128_vs_nopos"]) else None
        nopos = self.row("nopos")
        if nopos is None or not _measured(nopos.get("train_img_s_b128")):
            return None
        return nopos["train_img_s_b128"] / row["train_img_s_b128"]

    def changes_since(self, method: str) -> list[Change]:
        measured = datetime.fromisoformat(self.code_committed)
        return [c for c in CUDA_CHANGES if method in c.methods and datetime.fromisoformat(c.committed) > measured]


def _printed(folder: Path, prefix: str, patterns: tuple[str, ...]) -> list[dict]:
    """The JSON objects of the lines starting with ``prefix`` in the folder's files matching ``patterns``."""
    objects, seen = [], set()
    for pattern in patterns:
        for path in sorted(folder.glob(pattern)):
            for line in path.read_text().splitlines():
                if line.startswith(prefix) and line not in seen:
                    seen.add(line)
                    objects.append(json.loads(line[len(prefix) :]))
    return objects


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_run(folder: Path) -> GpuRun:
    """A GPU run from its folder (module doc); a folder without rows is an error naming what it needs."""
    folder = Path(folder)
    meta_path = folder / "run.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{folder}: no run.json (the GPU, torch release and code of the run: keys gpu, torch, date, code,"
            " code_committed); `.ci/gpu` writes it beside its output"
        )
    meta = json.loads(meta_path.read_text())
    missing = [key for key in ("gpu", "torch", "date", "code", "code_committed") if key not in meta]
    if missing:
        raise ValueError(f"{meta_path}: missing {', '.join(missing)}")
    rows_file, sweep_file = folder / "throughput_rows.jsonl", folder / "sweep_rows.jsonl"
    rows = _jsonl(rows_file) if rows_file.is_file() else _printed(folder, "row: ", ROW_FILES)
    sweep = _jsonl(sweep_file) if sweep_file.is_file() else _printed(folder, "sweep: ", ("sweep*.txt",))
    if not rows and not sweep:
        raise ValueError(
            f"{folder}: no measured rows (throughput_rows.jsonl, or `row:` lines in {', '.join(ROW_FILES)};"
            " sweep_rows.jsonl, or `sweep:` lines in sweep*.txt)"
        )
    run = GpuRun(folder, meta["gpu"], meta["torch"], meta["date"], meta["code"], meta["code_committed"], rows, sweep)
    run.measured_as_specs, run.bounds = dict(meta.get("measured_as", {})), dict(meta.get("bounds", {}))
    return run


def load_runs(folders: list[Path]) -> list[GpuRun]:
    """The runs, oldest code first."""
    runs = [load_run(folder) for folder in folders]
    return sorted(runs, key=lambda run: datetime.fromisoformat(run.code_committed))


def _newest(runs: list[GpuRun], method: str, measure: Measure) -> tuple[GpuRun, dict] | None:
    for run in reversed(runs):
        if measure == "long-sequence":
            points = [p for p in run.sweep if p["method"] == method and p["tokens"] == LONG_SEQUENCE_TOKENS]
            if points:
                return run, points[-1]
        elif (row := run.row(method)) is not None:
            return run, row
    return None


def _judge(target: Target, run: GpuRun, row: dict) -> tuple[str, str]:
    """(what was measured, status) of one encoding's row."""
    if target.measure == "long-sequence":
        if row.get("status") != "ok":
            return str(row.get("status")), "failed"
        one_head_scores_mib = target.limit**2 * 2 / 2**20
        figure = f"{row['peak_mib']:,.0f} MiB / {row['ms']:,.1f} ms"
        return figure, "met" if row["peak_mib"] < one_head_scores_mib else "not met"
    ratio = run.train_ratio(row)
    if ratio is None:
        # how a failed measurement reads (bench.failure_cell): in the kernel column when the
        # whole encoding failed, in the training cell when only its training step did
        for failure in (str(row.get("kernel", "")), str(row.get("train_img_s_b128", ""))):
            if failure.startswith(("error", "OOM")):
                return failure[:60], "failed"
        return "no batch-128 training figure", "not measured"
    if target.measure == "timm":
        return f"nopos {ratio:.3f}× timm's speed", "met" if ratio >= target.limit else "not met"
    if target.measure == "ratio":
        return f"{ratio:.3f}× nopos", "met" if ratio <= target.limit else "not met"
    bound = run.bounds.get(row["method"]) or _flop_bound(run.measured_as(row["method"]))
    if bound is None:
        return f"{ratio:.3f}× nopos, no FLOP model", "not measured"
    over = ratio / bound
    return f"{ratio:.3f} / {bound:.3f} = {over:.2f}", "met" if over <= target.limit else "not met"


def _measured(value: object) -> bool:
    """A number, not a failure's text."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _flop_bound(method: str) -> float | None:
    from pe_bench.harness.reports.bench import MODELS
    from pe_bench.harness.reports.throughput import flop_bound

    config, image_size = MODELS["vit-b"]
    return flop_bound(method, config, image_size)


def targets_table(runs: list[GpuRun]) -> pd.DataFrame:
    """One row per (target, encoding): the newest run's figure, whether it meets the target,
    the run, the form it measured where that is not today's default, and the changes to the
    encoding's CUDA path since that run."""
    records = []
    for target in targets():
        for method in target.methods:
            found = _newest(runs, method, target.measure)
            record = {"target": target.name, "encoding": method}
            if found is None:
                records.append({**record, "measured": "", "status": "not measured", "run": "", "since the run": ""})
                continue
            run, row = found
            measured, status = _judge(target, run, row)
            form = run.measured_as(method)
            since = [f"{c.what} (stop {c.stop})" for c in run.changes_since(method)]
            if datetime.fromisoformat(run.code_committed) < datetime.fromisoformat(LISTED_FROM):
                since.insert(0, EARLIER_CHANGES)
            records.append(
                {
                    **record,
                    "measured": measured + ("" if form == method else f", as {form}"),
                    "status": status,
                    "run": run.label,
                    "since the run": ", ".join(since),
                }
            )
    return pd.DataFrame.from_records(records)


def targets_markdown(runs: list[GpuRun]) -> str:
    table = targets_table(runs).rename(columns={"since the run": "changed on CUDA since the run"})
    return table.to_markdown(index=False)


def default_folders(root: Path = Path(".")) -> list[Path]:
    """The GPU runs shipped in the repository (``benchmarks/gpu-*`` under ``root``)."""
    return sorted(path for path in (root / "benchmarks").glob("gpu-*") if path.is_dir())


def run_json(gpu: str, torch_version: str, code: str, code_committed: str | None = None) -> dict:
    """The ``run.json`` of a run measured now (``.ci/gpu``): no listed change is newer than it."""
    now = datetime.now(timezone.utc)
    return {
        "gpu": gpu,
        "torch": torch_version,
        "date": now.date().isoformat(),
        "code": code,
        "code_committed": code_committed or now.isoformat(timespec="seconds"),
    }
