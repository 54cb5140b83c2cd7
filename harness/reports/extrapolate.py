"""``pe-bench extrapolate``: evaluate the stored best checkpoints of a grid at resolutions
other than the training one, without changing the model (PaPE Section 5.3, Appendix B).

Two settings per resolution: positions as they are, and position interpolation (positions
multiplied by train/test size per axis, mapping them back into the training range). Writes
under ``<out>/extrapolation/<task>/``:

    results.csv   one row per (method, seed, resolution, interpolation)
    table5.md     accuracy without interpolation (PaPE Table 5)
    table6.md     with interpolation, and the change against table 5 per cell (Table 6)
    table7.md     per method the better of the two settings (Table 7)
    figure.png/.pdf  accuracy against resolution, one line per method (Figure 1c)

Finished cells without a usable checkpoint (best.ckpt or config.yaml missing) are named on
the console and under each table, never silently left out.

The tables follow the result matrix's rules (harness/reports/tables.py): a cell holding fewer
seeds than its task asked for (the seeds any method of the task finished, failed or diverged
on) shows ``(held/asked)``, and the missing seeds are named under the tables with why (failed,
diverged, no usable checkpoint, not run); a cell with a seed trained in another configuration
than its task's (tables.check_configs) is marked ``†``; a cell with a seed whose training stopped
before its planned epochs (the record's ``cut_short``: trainer.max_time) is marked ``§``
(tables.CUT_MARK) and the notes say how far each such seed got. A seed stored ``ok`` without a
finite score is no trained seed (tables._scored): it is not evaluated and is named as missing
(diverged), as the matrix counts it. Only complete cells (every seed asked for, each trained to
the end of its schedule) of the task's configuration are ranked: the best printed value is bold
(equal printed values share it), the next-best underlined, ranked by the printed one-decimal
text itself.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import yaml

from pe_bench.adapters import get as get_encoding
from pe_bench.harness.grid import store
from pe_bench.harness.grid.runner import cell_setup
from pe_bench.tasks import get_task

from ..config_diff import canonical
from . import tables


def parse_resolutions(text: str) -> list[tuple[int, int]]:
    """``"24,48,96x48"`` -> [(24, 24), (48, 48), (96, 48)] as (height, width)."""
    sizes = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        h, _, w = item.partition("x")
        sizes.append((int(h), int(w or h)))
    return sizes


PAPE_APPENDIX_B = [224, 320, 384, 448, 512, 640, 768, 896, 1024]


def default_resolutions(image_size: int, patch: int, profile: str) -> list[tuple[int, int]]:
    """Paper profile: PaPE Appendix B's 224^2 ... 1024^2. Otherwise 1x to 4x the training
    side (multiples of the patch size)."""
    if profile == "paper" and image_size == 224:
        return [(r, r) for r in PAPE_APPENDIX_B]
    sides = [round(image_size * f / patch) * patch for f in (1, 1.5, 2, 3, 4)]
    return [(s, s) for s in dict.fromkeys(sides)]


def resolution_label(size: tuple[int, int]) -> str:
    h, w = size
    return f"{h}²" if h == w else f"{h}×{w}"


@dataclass
class Cell:
    method: str
    seed: int
    directory: Path


def _trained_cells(out: Path, task: str, methods: list[str] | None) -> Iterator[tuple[Cell, str]]:
    """Every trained cell of ``task`` (ok with a finite score, as the matrix counts one:
    tables._scored) with why it cannot be evaluated ("" if it can). A seed stored ok with a
    non-finite score is none: the matrix counts it as diverged, and so does ``seed_context``."""
    for record in store.load_records(out):
        if record.task != task or not tables._scored(record):
            continue
        if methods is not None and record.method not in methods:
            continue
        directory = store.cell_dir(out, task, record.method, record.seed)
        problem = ""
        if not (directory / "best.ckpt").is_file():
            problem = f"no best.ckpt in {directory}"
        elif why := store.read_config(directory)[1]:
            problem = f"{why.removeprefix('its ')} in {directory}"
        yield Cell(record.method, record.seed, directory), problem


def finished_cells(out: Path, task: str, methods: list[str] | None) -> list[Cell]:
    return [cell for cell, problem in _trained_cells(out, task, methods) if not problem]


def cells_without_checkpoint(out: Path, task: str, methods: list[str] | None) -> list[str]:
    """``"rope seed 1: no best.ckpt in <dir>"`` for each trained cell that cannot be evaluated."""
    return [f"{cell.method} seed {cell.seed}: {problem}" for cell, problem in _trained_cells(out, task, methods)
            if problem]  # fmt: skip


def evaluable_cells(out: Path, task: str, methods: list[str] | None) -> tuple[list[Cell], list[str]]:
    """(cells to evaluate, the trained cells left out and why); an error if there is none."""
    cells = finished_cells(out, task, methods)
    left_out = cells_without_checkpoint(out, task, methods)
    if not cells:
        raise FileNotFoundError(
            f"no finished {task} cells with checkpoints under {out}/runs/{task}/"
            + (f" (left out: {'; '.join(left_out)})" if left_out else "")
            + f"; run `pe-bench run --tasks {task} --methods ...` first"
        )
    return cells, left_out


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a Lightning checkpoint, loaded with ``weights_only``: a checkpoint
    in a shared results folder must not be able to run code when it is read."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = next((line for line in str(err).splitlines() if "GLOBAL" in line), "").strip()
        raise ValueError(
            f"{path} is not a plain weights checkpoint ({found or 'it holds Python objects'}); refused to load it, "
            "since unpickling it could run code. Retrain that cell, or load the file yourself if you trust it."
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        first = (str(err).splitlines() or [""])[0]
        raise ValueError(f"{path} cannot be read ({type(err).__name__}: {first}); retrain that cell") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ValueError(f"{path} holds no 'state_dict'; it is not a checkpoint of `pe-bench run`")
    return checkpoint["state_dict"]


def load_cell(directory: Path, data_root: Path | None):
    """Rebuild the task and the model of a finished cell and load its best weights."""
    config, make_encoding = cell_setup(yaml.safe_load((directory / "config.yaml").read_text()))
    task = get_task(config.task)(config, data_root)
    model = task.build_model(make_encoding)
    state = load_weights(directory / "best.ckpt")
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    return task, model.eval(), make_encoding.name


@torch.inference_mode()
def accuracy(model: torch.nn.Module, loader) -> float:
    correct = total = 0
    for images, labels in loader:
        correct += (model(images).argmax(-1) == labels).sum().item()
        total += labels.numel()
    return 100.0 * correct / max(total, 1)


def interpolation_scale(train: tuple[int, int], test: tuple[int, int]) -> torch.Tensor:
    """Per-axis factor train/test (PaPE App. B: 224/R), applied to (row, col) positions."""
    return torch.tensor([train[0] / test[0], train[1] / test[1]])


def evaluate_grid(
    out: Path, task_name: str, resolutions: list[tuple[int, int]], methods: list[str] | None = None,
    data_root: Path | None = None, say=print,
) -> pd.DataFrame:  # fmt: skip
    cells, left_out = evaluable_cells(out, task_name, methods)
    for line in left_out:
        say(f"  left out, no usable checkpoint: {line}")
    # one test set per resolution and data configuration: a cell trained on other data (held-out
    # placements, noise, classes; marked †) is scored on its own, not on the first cell's
    test_sets: dict[tuple[tuple[int, int], str], object] = {}
    rows = []
    for cell in cells:
        task, model, encoding = load_cell(cell.directory, data_root)
        train = (task.data.image_size, task.data.image_size)
        data = task.datamodule(seed=cell.seed)
        data.setup("test")
        interpolable = get_encoding(encoding).supports_position_interpolation
        for size in resolutions:
            if size == train:
                # The cell's own test split, built as in training: the 1x column is the score the
                # cell recorded (without test-time augmentation, as ``test_acc_without_tta``).
                # A test set made at another resolution may differ (tiny data is regenerated).
                test_set = data.splits["test"]
            else:
                key = (size, canonical(task.config.data))
                if key not in test_sets:
                    test_sets[key] = data.test_set_at(*size)
                test_set = test_sets[key]
            loader = data.loader(test_set)
            for interpolate in (False, True):
                value = None
                if not interpolate or interpolable:
                    model.position_scale = interpolation_scale(train, size) if interpolate else 1.0
                    value = accuracy(model, loader)
                rows.append(
                    {
                        "method": cell.method,
                        "seed": cell.seed,
                        "resolution": resolution_label(size),
                        "pixels": size[0] * size[1],
                        "interpolation": interpolate,
                        "accuracy": value,
                    }
                )
        model.position_scale = 1.0
        say(f"  {task_name} · {cell.method} · seed {cell.seed}: evaluated at {len(resolutions)} resolutions")
    frame = pd.DataFrame(rows)
    frame.attrs["left_out"] = left_out  # noted under the tables (write_extrapolation)
    frame.attrs.update(seed_context(out, task_name, methods, cells))
    return frame


def seed_context(out: Path, task: str, methods: list[str] | None, cells: list[Cell]) -> dict:
    """What the tables need to know beyond the evaluated rows (``frame.attrs``), read as the
    result matrix reads it: ``asked``, the task's seeds asked for (those any method of the task
    finished, failed or diverged on, tables.asked_seeds); ``missing``, method -> seed -> why an
    asked seed was not evaluated (a seed stored ok without a finite score: diverged, naming the
    score, as the matrix counts it); ``outliers``, method -> seed -> how an evaluated cell's
    configuration differs from its task's (tables.check_configs over every stored cell of the
    task); ``cut_short``, method -> seed -> how far an evaluated seed whose training stopped
    before its planned epochs got (the record's ``schedule_text``; marked ``§`` as in the
    matrix); ``ties``, whether no configuration is shared by most cells."""
    results = tables.select_tasks(tables.load_results(out), [task])  # the cells evaluated hold records of it
    asked = tables.asked_seeds(results).get(task, [])
    check = tables.check_configs(results)
    evaluated = {(c.method, c.seed) for c in cells}
    status = {(r.method, r.seed): r.status for r in results.records}
    status.update({(m, s): store.STATUS_OK for _, m, s in results.incomplete})
    for r in results.records:  # ok without a finite score: no trained seed (tables._scored)
        if r.status == store.STATUS_OK and not tables._scored(r):
            status[(r.method, r.seed)] = "no stored score" if r.score is None else f"diverged (stored score {r.score})"
    shown = [
        r.method for r in results.records if r.status != store.STATUS_NA and (methods is None or r.method in methods)
    ]
    missing: dict[str, dict[int, str]] = {}
    for method in dict.fromkeys([*(c.method for c in cells), *shown, *(methods or [])]):
        why = {}
        for seed in asked:
            if (method, seed) in evaluated:
                continue
            stored = status.get((method, seed))
            why[seed] = {store.STATUS_OK: "no usable checkpoint", None: "not run"}.get(stored, stored)
        if why:
            missing[method] = why
    outliers: dict[str, dict[int, str]] = {}
    for (_, method, seed), difference in check.outliers.items():
        if (method, seed) in evaluated:
            outliers.setdefault(method, {})[seed] = difference
    cut_short: dict[str, dict[int, str]] = {}
    for r in results.records:
        if (r.method, r.seed) in evaluated and tables._scored(r) and r.cut_short:
            cut_short.setdefault(r.method, {})[r.seed] = r.schedule_text()
    return {
        "asked": asked,
        "missing": missing,
        "outliers": outliers,
        "cut_short": cut_short,
        "ties": task in check.ties,
    }


def _pivot(frame: pd.DataFrame, interpolate: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(mean accuracy, seeds it holds) with methods as rows and resolutions as columns."""
    subset = frame[frame["interpolation"] == interpolate]
    order = list(dict.fromkeys(subset.sort_values("pixels")["resolution"]))
    groups = subset.groupby(["method", "resolution"])["accuracy"]
    means = groups.mean().unstack("resolution").reindex(columns=order)
    held = groups.count().unstack("resolution").reindex(index=means.index, columns=order).fillna(0).astype(int)
    return means, held


def _asked(frame: pd.DataFrame) -> list[int]:
    """The seeds asked for: as stored (``evaluate_grid``), else every seed any method holds."""
    asked = frame.attrs.get("asked")
    return sorted(set(frame["seed"])) if asked is None else list(asked)


def _outliers(frame: pd.DataFrame) -> dict[str, dict[int, str]]:
    return frame.attrs.get("outliers") or {}


def _cut_short(frame: pd.DataFrame) -> dict[str, dict[int, str]]:
    return frame.attrs.get("cut_short") or {}


def _marks(method: str, frame: pd.DataFrame) -> str:
    """`` †`` (another configuration) and `` §`` (a seed cut short), in the matrix's order."""
    return tables.seed_marks(method not in _outliers(frame), method in _cut_short(frame))


def _suffixes(table: pd.DataFrame, held: pd.DataFrame, frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(text after each value: `` (held/asked)``, `` †`` and `` §``; whether the cell may be ranked)."""
    asked, unranked = len(_asked(frame)), {*_outliers(frame), *_cut_short(frame)}
    suffix = pd.DataFrame("", index=table.index, columns=table.columns)
    eligible = pd.DataFrame(False, index=table.index, columns=table.columns)
    for method in table.index:
        for column in table.columns:
            if pd.isna(table.loc[method, column]):
                continue
            n = int(held.loc[method, column])
            text = f" ({n}/{asked})" if n < asked else ""
            suffix.loc[method, column] = text + _marks(method, frame)
            eligible.loc[method, column] = n >= asked and method not in unranked
    return suffix, eligible


def _marked(table: pd.DataFrame, text: pd.DataFrame, eligible: pd.DataFrame) -> pd.DataFrame:
    """Bold the best and underline the next-best ranked value of each column, as the result
    matrix does (tables._emphasis): by the printed one-decimal value (format's rounding, not
    pandas' round, which differs next to a .x5: two cells printed alike got one bold, one
    underlined), equal printed values sharing the mark, only ``eligible`` (complete cells of
    the task's configuration, no seed cut short) ranked, and nothing marked with fewer than two of them."""
    marked = text.copy()
    for column in table.columns:
        ranked = eligible[column].astype(bool) & table[column].notna()
        shown = table.loc[ranked, column].map(lambda v: float(f"{v:.1f}"))
        if len(shown) < 2:
            continue
        rest = shown[shown != shown.max()]
        for method in shown.index[shown == shown.max()]:
            marked.loc[method, column] = f"**{text.loc[method, column]}**"
        if len(rest):
            for method in rest.index[rest == rest.max()]:
                marked.loc[method, column] = f"<u>{text.loc[method, column]}</u>"
    return marked


def _fmt(table: pd.DataFrame) -> pd.DataFrame:
    return table.apply(lambda col: col.map(lambda v: "n/a" if pd.isna(v) else f"{v:.1f}"))


def extrapolation_tables(frame: pd.DataFrame) -> dict[str, str]:
    (plain, held_plain), (interp, held_interp) = _pivot(frame, False), _pivot(frame, True)
    suffix5, eligible5 = _suffixes(plain, held_plain, frame)
    table5 = _marked(plain, _fmt(plain) + suffix5, eligible5)
    change = interp - plain
    text6 = _fmt(interp).copy()
    for method in interp.index:
        for column in interp.columns:
            if pd.notna(change.loc[method, column]):
                text6.loc[method, column] += f" ({change.loc[method, column]:+.1f})"
    suffix6, eligible6 = _suffixes(interp, held_interp, frame)
    table6 = _marked(interp, text6 + suffix6, eligible6)
    # Table 7: per method the setting with the higher mean accuracy over all resolutions.
    use_interp = interp.mean(axis=1).fillna(-1) > plain.mean(axis=1)
    best = pd.DataFrame([interp.loc[m] if use_interp[m] else plain.loc[m] for m in plain.index], index=plain.index)
    suffix7 = pd.DataFrame([suffix6.loc[m] if use_interp[m] else suffix5.loc[m] for m in plain.index])
    eligible7 = pd.DataFrame([eligible6.loc[m] if use_interp[m] else eligible5.loc[m] for m in plain.index])
    labels = [f"{m} ({'with' if use_interp[m] else 'without'} interpolation)" for m in best.index]
    text7 = (_fmt(best) + suffix7.reindex(index=best.index, columns=best.columns)).set_axis(labels)
    eligible7 = eligible7.reindex(index=best.index, columns=best.columns).set_axis(labels)
    table7 = _marked(best.set_axis(labels), text7, eligible7)
    for t in (table5, table6, table7):
        t.index.name = "Position encoding"
    return {
        "table5": table5.to_markdown(disable_numparse=True),
        "table6": table6.to_markdown(disable_numparse=True),
        "table7": table7.to_markdown(disable_numparse=True),
    }


def extrapolation_notes(frame: pd.DataFrame) -> list[str]:
    """The notes under every table: seeds asked for, the missing ones and why, the ranking
    rule, the cells of another configuration (†) with how they differ, and the seeds cut
    short (§) with how far they got (as the matrix's notes, tables._notes)."""
    asked = _asked(frame)
    notes = [
        f"Mean over seeds; {len(asked)} seed(s) asked for ({', '.join(map(str, asked))}). "
        "A cell holding fewer shows (held/asked)."
    ]
    missing = frame.attrs.get("missing")
    if missing is None:  # a frame built in memory: the seeds other methods hold
        held = frame.groupby("method")["seed"].agg(set)
        missing = {m: {s: "not evaluated" for s in asked if s not in held[m]} for m in held.index}
    parts = [
        f"{method} " + ", ".join(f"seed {seed} {why}" for seed, why in sorted(seeds.items()))
        for method, seeds in missing.items()
        if seeds
    ]
    if parts:
        notes.append("Missing seeds: " + "; ".join(parts) + ".")
    notes.append(
        "Only complete cells (every seed asked for, each trained to the end of its schedule) of the task's "
        "configuration are ranked: best bold (equal printed values share it), next-best underlined; a cell with "
        f"missing seeds (held/asked), another configuration (†) or a seed cut short ({tables.CUT_MARK}) is never "
        "marked, whatever its value."
    )
    outliers = _outliers(frame)
    if outliers:
        parts = [
            f"{method} seed {seed}: {why}" for method, seeds in outliers.items() for seed, why in sorted(seeds.items())
        ]
        notes.append("† another configuration than the rest of its task (not ranked): " + "; ".join(parts) + ".")
    cut = _cut_short(frame)
    if cut:
        parts = [f"{method} seed {seed}: {how}" for method, seeds in cut.items() for seed, how in sorted(seeds.items())]
        notes.append(
            f"{tables.CUT_MARK} a seed whose training stopped before its planned epochs: the cell holds a shorter "
            "schedule's checkpoint (not ranked; trainer.max_time stops training quietly and the best checkpoint so "
            "far is evaluated): " + "; ".join(parts) + "."
        )
    if frame.attrs.get("ties"):
        notes.append(
            "No configuration is shared by most cells of the task; the first one found is taken as the task's."
        )
    return notes


def plot(frame: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plain = frame[~frame["interpolation"]]
    means = plain.groupby(["method", "resolution", "pixels"])["accuracy"].mean().reset_index()
    asked = len(_asked(frame))
    held = plain.groupby("method")["seed"].nunique()
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, group in means.groupby("method"):
        group = group.sort_values("pixels")
        label = method + (f" ({held[method]}/{asked})" if held[method] < asked else "")
        label += _marks(method, frame)
        ax.plot(group["resolution"], group["accuracy"], marker="o", label=label)
    ax.set_xlabel("evaluation resolution")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=150)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)


def write_extrapolation(out: Path, task_name: str, frame: pd.DataFrame, train_label: str) -> str:
    target = Path(out) / "extrapolation" / task_name
    target.mkdir(parents=True, exist_ok=True)
    frame.to_csv(target / "results.csv", index=False)
    tables = extrapolation_tables(frame)
    captions = {
        "table5": f"Extrapolation without position interpolation (trained at {train_label}); best bold.",
        "table6": "With position interpolation (positions x train/test size); change against table 5 in brackets.",
        "table7": "Best configuration per encoding (the setting with the higher mean over resolutions).",
    }
    left_out = frame.attrs.get("left_out") or []
    note = "".join(f"\n- {line}" for line in left_out)
    note = f"\nLeft out (trained, but no usable checkpoint):{note}\n" if left_out else ""
    note = "\n" + "\n\n".join(extrapolation_notes(frame)) + "\n" + note
    text = []
    for name, table in tables.items():
        body = f"{captions[name]}\n\n{table}\n{note}"
        (target / f"{name}.md").write_text(body)
        text.append(f"### {name}\n{body}")
    plot(frame, target / "figure", f"{task_name}: accuracy vs resolution (trained at {train_label})")
    return "\n".join(text)
