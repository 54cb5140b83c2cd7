"""The result matrix, built with pandas from the stored cells only.

Methods as rows, tasks as columns (metric named in the header, ↓ for lower-is-better), mean ±
std over seeds (or ± the half-width of a Student-t confidence interval), an Average column
over the higher-is-better columns, n/a where the encoding is not defined for the task.
Markdown, LaTeX (booktabs) and CSV.

What a table guarantees:

- Seeds. A cell shows how many seeds it holds out of those asked for, ``99.60 (1/3)``, unless
  it holds all of them (the footnote gives the seeds asked for per task). The seeds asked
  for are those of the task found in the stored records of any of its methods (finished,
  failed or diverged). A cell without any finished seed reads ``failed`` or ``diverged``.
- Configuration. Every finished cell's ``config.yaml`` is read. Per task, the configuration
  most cells share (ignoring the per-method keys, and comparing the rest by the rules of
  harness/config_diff.py, as the grid runner does) is the task's; a cell trained otherwise
  is marked ``†`` and the footnote names the differing keys. Per (task, method), the method's
  own options (``options``) are compared across its seeds the same way: a cell whose seeds
  were trained with other options is marked ``†`` too, the footnote naming the key and the
  seeds. A finished cell without a readable config.yaml is left out and listed.
- Schedule. A cell with a seed whose training stopped before its planned epochs (the time
  cap ``trainer.max_time``, recorded as the record's ``stopped_by``/``epochs_run``) is marked
  ``§`` and the footnote says how far each such seed got; records written before these fields
  existed read as complete.
- Spread. A cell whose seeds spread by more than ``SPREAD_LIMIT`` (std, in the metric's units;
  issue 14's target for the tiny profiles) is marked ``‡``: its mean says little about where the
  encoding ranks (some seeds learned the task and some did not), and a paired test against
  the best often cannot reject it, so it can be bold for its spread alone. The mark does not
  change the ranking; it tells the reader to look at the seeds.
- Ranking. Only complete cells (every seed asked for, each trained to the end of its schedule)
  of the task's configuration are ranked and averaged; a cell with missing seeds, another
  configuration (†) or a seed cut short (§) is never marked best. By
  default the best cell is bold together with every ranked cell not significantly different
  from it (two-sided paired t-test over the seeds both hold, α = 0.05): with a few seeds a
  single bold winner is often noise. The next-best of the rest is underlined. Without a
  test (fewer than 2 shared seeds), or with ``significance=False``, the best alone is bold.

``table.csv`` holds one machine-readable row per (task, method): ``SUMMARY_COLUMNS``.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from pe_bench.harness.grid import store

from ..config_diff import ABSENT, EFFECTIVE, RESOLVED_OPTIONS, canonical, one_sided_is_no_change, result_keys
from ..config_diff import config_differences as diff_configs
from . import latex
from .stats import paired_p_value, t_interval

CONFIG = "config.yaml"
# Keys of a cell's config that belong to its method, not to the task's setting.
PER_METHOD_KEYS = ("method", "encoding", "options", RESOLVED_OPTIONS, "methods")
# The method's own settings, compared across the seeds of one (task, method) cell. ``options``
# holds what the encoding ran with (the profile's ``methods.<encoding>`` merged with the
# label's own), ``resolved_options`` every option with the code's defaults (since stop 71);
# ``methods`` holds every encoding's, ``method``/``encoding`` are the cell's name.
METHOD_OPTION_KEYS = ("options", RESOLVED_OPTIONS)
CUT_MARK = "§"  # a seed whose training stopped before its planned epochs (trainer.max_time)

SUMMARY_COLUMNS = [
    "task", "method", "metric", "higher_is_better", "mean", "std", "n", "asked", "failed", "diverged",
    "status", "config_ok", "wide_spread", "ci_low", "ci_high", "p_vs_best", "cut_short",
]  # fmt: skip
STATUS_PARTIAL = "partial"  # some, not all, of the seeds asked for finished
STATUS_MISSING = "missing"  # no finished seed, and none failed or diverged
DEFAULT_CI = 0.95  # table.csv's ci_low/ci_high when no other level is asked for
ALPHA = 0.05
AVERAGE = "Average"
# Seed std above which a cell is marked ‡. 3 points is issue 14's stability target for the tiny
# profiles; every built-in metric is on a 0-100 scale (%, mAP, BLEU, WER), so one limit fits all.
SPREAD_LIMIT = 3.0

CellKey = tuple[str, str, int]  # (task, method, seed)


class CellConfigError(ValueError):
    """A finished cell's config.yaml is missing or cannot be read."""


def read_cell_config(directory: Path) -> dict[str, Any]:
    """The resolved config a cell ran with (its ``config.yaml``); ``CellConfigError`` saying
    why when there is none or it cannot be read."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise CellConfigError(f"no {CONFIG}")
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise CellConfigError(f"unreadable {CONFIG}: {type(err).__name__}") from err
    if not isinstance(config, dict):
        raise CellConfigError(f"{CONFIG} is not a mapping")
    return config


@dataclass(frozen=True)
class StoredResults:
    """What the tables are built from.

    ``records``: every stored record that enters the tables. ``configs``: the config of each
    finished cell among them, or None when not checked (records built in memory).
    ``incomplete``: finished cells left out because their config.yaml is missing or
    unreadable, with the reason; their seeds still count as asked for.
    """

    records: list[store.CellRecord]
    configs: dict[CellKey, dict[str, Any]] | None = None
    incomplete: dict[CellKey, str] = field(default_factory=dict)


class DuplicateCellError(ValueError):
    """The same (task, method, seed) is stored in two of the results folders being merged."""


def load_results(out: Path | Sequence[Path]) -> StoredResults:
    """The stored records under ``out`` with the config.yaml of every finished cell.

    Several folders (results of other machines, columns re-run at different times) merge into
    one matrix; a cell stored in two of them is an error, since either number could be the one
    shown. Their configurations are checked together: a task trained otherwise in one folder
    is marked as in a single folder.
    """
    folders = [Path(out)] if isinstance(out, (str, Path)) else [Path(o) for o in out]
    records, configs, incomplete = [], {}, {}
    origin: dict[CellKey, Path] = {}
    for folder in folders:
        for record in store.load_records(folder):
            key = _key(record)
            if key in origin:
                raise DuplicateCellError(
                    f"cell {_cell_name(key)} is stored in both {origin[key]} and {folder}; "
                    "remove one of the two, or render the folders separately"
                )
            origin[key] = folder
            if record.status == store.STATUS_OK:
                try:
                    configs[key] = read_cell_config(store.cell_dir(folder, *key))
                except CellConfigError as err:
                    incomplete[key] = str(err)
                    continue
            records.append(record)
    records.sort(key=_key)  # columns and rows in the same order as from one folder
    return StoredResults(records, configs, incomplete)


def select_tasks(results: StoredResults, tasks: Sequence[str]) -> StoredResults:
    """Only the records (and incomplete cells) of ``tasks``, in the order stored. A name that no
    record holds is an error naming the tasks that are there, since an empty column would read
    as if the task had nothing to show."""
    held = sorted({r.task for r in results.records} | {task for task, _, _ in results.incomplete})
    for task in tasks:
        if task not in held:
            close = difflib.get_close_matches(task, held, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KeyError(f"no stored cell of task {task!r}{hint}; the results hold: {', '.join(held)}")
    wanted = set(tasks)
    return StoredResults(
        [r for r in results.records if r.task in wanted],
        None if results.configs is None else {k: v for k, v in results.configs.items() if k[0] in wanted},
        {k: v for k, v in results.incomplete.items() if k[0] in wanted},
    )


def _key(record: store.CellRecord) -> CellKey:
    return record.task, record.method, record.seed


def as_results(results: StoredResults | Iterable[store.CellRecord]) -> StoredResults:
    """Plain records (built in memory) become results whose configurations are not checked."""
    return results if isinstance(results, StoredResults) else StoredResults(list(results))


def _cell_name(key: CellKey) -> str:
    return f"{key[0]}/{key[1]}/seed{key[2]}"


def asked_seeds(results: StoredResults) -> dict[str, list[int]]:
    """task -> the seeds asked for: those of the task's finished, failed or diverged records of
    any method (and of the cells left out as incomplete)."""
    seeds: dict[str, set[int]] = defaultdict(set)
    for record in results.records:
        if record.status in (store.STATUS_OK, store.STATUS_FAILED, store.STATUS_DIVERGED):
            seeds[record.task].add(record.seed)
    for task, _, seed in results.incomplete:
        seeds[task].add(seed)
    return {task: sorted(s) for task, s in seeds.items()}


# --- configurations -----------------------------------------------------------------------


def result_config(config: dict[str, Any]) -> dict[str, Any]:
    """A cell config without the keys that belong to its method (compared across methods)."""
    return {k: v for k, v in config.items() if k not in PER_METHOD_KEYS}


def _fingerprint(task: str, tree: dict[str, Any]) -> frozenset[tuple[str, str]]:
    """The configuration as harness/config_diff.py compares it, as a set: the result-relevant
    keys outside ``effective`` (checked on its own, ``_effective_outliers``), without the typed
    fields at their defaults and the retired keys at their no-change values. Two cells have the
    same fingerprint exactly when config_diff finds no difference between them, so counting
    fingerprints counts configurations (counting raw key sets split one configuration in two
    where one file lacked a field the other held at its default)."""
    return frozenset(
        (key, canonical(value))
        for key, value in result_keys(_without_effective(tree)).items()
        if not one_sided_is_no_change(task, key, value)
    )


def _without_effective(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in tree.items() if k != EFFECTIVE}


def _show(value: Any) -> str:
    if value is ABSENT:
        return "absent"
    return value if isinstance(value, str) else canonical(value)


def config_differences(task: str, tree: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """``key=value (others: value)`` for every result-relevant key where ``tree`` differs from
    the task's ``reference`` (the rules of harness/config_diff.py, as the grid runner's)."""
    return [
        f"{key}={_show(mine)} (others: {_show(theirs)})" for key, mine, theirs in diff_configs(task, tree, reference)
    ]


@dataclass(frozen=True)
class ConfigCheck:
    """``task_differences``: cell -> how its configuration differs from its task's;
    ``option_differences``: cell -> how its method options differ from those of the method's
    other seeds. ``ties``: tasks where no single configuration is the most common (the first
    found is taken)."""

    task_differences: dict[CellKey, str]
    ties: list[str]
    option_differences: dict[CellKey, str] = field(default_factory=dict)

    @property
    def outliers(self) -> dict[CellKey, str]:
        """Every cell marked †, which the tables neither rank nor read further: both kinds of
        difference, joined."""
        return {
            key: ", ".join(part for part in (self.task_differences.get(key), self.option_differences.get(key)) if part)
            for key in dict.fromkeys([*self.task_differences, *self.option_differences])
        }


def check_configs(results: StoredResults) -> ConfigCheck:
    """Per task, the configuration shared by most finished cells, and the cells trained otherwise."""
    if results.configs is None:
        return ConfigCheck({}, [])
    by_task: dict[str, list[tuple[CellKey, dict[str, Any]]]] = defaultdict(list)
    for record in results.records:
        key = _key(record)
        if key in results.configs:
            by_task[record.task].append((key, result_config(results.configs[key])))
    outliers: dict[CellKey, list[str]] = defaultdict(list)
    ties = []
    options = _option_outliers(results)
    for task, cells in by_task.items():
        prints = [_fingerprint(task, tree) for _, tree in cells]
        common = Counter(prints).most_common()  # equal counts keep the order first found
        tied = len(common) > 1 and common[0][1] == common[1][1]
        members = [cell for cell, mark in zip(cells, prints, strict=True) if mark == common[0][0]]
        reference = _without_effective(members[0][1])
        for key, tree in cells:
            outliers[key] += config_differences(task, _without_effective(tree), reference)
        effective, effective_tied = _effective_outliers(cells, members)
        for key, differences in effective.items():
            outliers[key] += differences
        if tied or effective_tied:
            ties.append(task)
    return ConfigCheck({key: ", ".join(d) for key, d in outliers.items() if d}, ties, options)


def _method_options(tree: dict[str, Any]) -> dict[str, Any]:
    return {key: tree.get(key) or {} for key in METHOD_OPTION_KEYS}


def _option_outliers(results: StoredResults) -> dict[CellKey, str]:
    """Per (task, method): the method options most of its seeds share are the cell's (equal
    counts: the lowest seed's); each seed trained with others -> ``options.KEY=VALUE (seeds
    S: VALUE)``, naming the seeds that hold the cell's. Compared by harness/config_diff.py's
    rules, as the runner compares a stored cell's options: a key one seed lacks differs (an
    option's default may have changed between the two trainings)."""
    by_cell: dict[tuple[str, str], list[tuple[CellKey, dict[str, Any]]]] = defaultdict(list)
    for record in results.records:
        key = _key(record)
        if key in (results.configs or {}):
            by_cell[(record.task, record.method)].append((key, _method_options(results.configs[key])))
    outliers: dict[CellKey, str] = {}
    for (task, _), cells in by_cell.items():
        prints = [_fingerprint(task, tree) for _, tree in cells]
        common = Counter(prints).most_common()
        if len(common) < 2:
            continue
        members = [key for (key, _), mark in zip(cells, prints, strict=True) if mark == common[0][0]]
        reference = next(tree for (key, tree) in cells if key == members[0])
        seeds = sorted(seed for _, _, seed in members)
        holders = f"seed{seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
        for key, tree in cells:
            differences = diff_configs(task, tree, reference)
            if differences:
                outliers[key] = ", ".join(
                    f"{name}={_show(mine)} ({holders}: {_show(theirs)})" for name, mine, theirs in differences
                )
    return outliers


def _effective_outliers(
    cells: list[tuple[CellKey, dict[str, Any]]], members: list[tuple[CellKey, dict[str, Any]]]
) -> tuple[dict[CellKey, list[str]], bool]:
    """How the trainer's settings took effect (``effective``: precision, compile, world size,
    the data's versions), compared among the cells that record it: per key, the value most of
    the task's configuration's ``members`` hold is the task's, and any cell holding another is
    an outlier. A cell stored before a key existed does not say, so it is not compared on it;
    comparing each cell with one reference cell instead missed every mix (fp32 CPU seeds beside
    bf16 compiled GPU seeds) whenever the reference was such an older cell. Also whether a
    key's most common value was tied."""
    values: dict[str, Counter] = defaultdict(Counter)
    shown: dict[str, Any] = {}  # canonical text -> a value that has it, for the footnote
    for _, tree in members:
        for key, value in _effective_keys(tree).items():
            values[key][canonical(value)] += 1
            shown.setdefault(canonical(value), value)
    tied = False
    majority = {}
    for key, counter in values.items():
        ranked_values = counter.most_common()
        tied |= len(ranked_values) > 1 and ranked_values[0][1] == ranked_values[1][1]
        majority[key] = ranked_values[0][0]
    outliers: dict[CellKey, list[str]] = defaultdict(list)
    for cell, tree in cells:
        for key, value in _effective_keys(tree).items():
            if key in majority and canonical(value) != majority[key]:
                outliers[cell].append(f"{key}={_show(value)} (others: {_show(shown[majority[key]])})")
    return outliers, tied


def _effective_keys(tree: dict[str, Any]) -> dict[str, Any]:
    """The ``effective.*`` keys a cell's configuration records (none for a cell stored before)."""
    return result_keys({EFFECTIVE: tree.get(EFFECTIVE) or {}})


# --- one row per (task, method) ------------------------------------------------------------


def _status(n: int, asked: int, failed: int, diverged: int, not_applicable: bool) -> str:
    if not_applicable:
        return store.STATUS_NA
    if n:
        return store.STATUS_OK if n >= asked else STATUS_PARTIAL
    if failed:
        return store.STATUS_FAILED
    return store.STATUS_DIVERGED if diverged else STATUS_MISSING


def summary(
    results: StoredResults | Iterable[store.CellRecord],
    ci: float | None = None,
    check: ConfigCheck | None = None,
    spread_limit: float = SPREAD_LIMIT,
) -> pd.DataFrame:
    """One row per (task, method): ``SUMMARY_COLUMNS`` plus ``scores`` (seed -> score).

    ``n`` finished seeds of ``asked``; ``failed``/``diverged`` seed counts; ``status`` ok
    (complete), partial, failed, diverged, missing or n/a; ``config_ok`` False for a cell with
    a seed trained in another configuration than its task's (or with other method options
    than the method's other seeds); ``cut_short`` True for a cell with a seed whose training
    stopped before its planned epochs (trainer.max_time); ``wide_spread`` True when its
    seeds' std exceeds ``spread_limit``; ``ci_low``/``ci_high`` the
    t-interval at level ``ci`` (default 95 %); ``p_vs_best`` the paired t-test's p-value
    against the task's best ranked cell (NaN for the best itself and without a test).
    """
    results = as_results(results)
    level = DEFAULT_CI if ci is None else ci
    outliers = (check or check_configs(results)).outliers
    asked = asked_seeds(results)
    groups: dict[tuple[str, str], list[store.CellRecord]] = defaultdict(list)
    for record in results.records:
        groups[(record.task, record.method)].append(record)
    rows = [
        _summary_row(records, len(asked.get(task, [])), outliers, level, spread_limit)
        for (task, _), records in groups.items()
    ]
    frame = pd.DataFrame(rows, columns=[*SUMMARY_COLUMNS, "scores"])
    for index in best_cells(frame).values():
        best = frame.loc[index]
        for other in frame.index[(frame["task"] == best["task"]) & (frame.index != index)]:
            frame.loc[other, "p_vs_best"] = paired_p_value(frame.loc[other, "scores"], best["scores"])
    return frame


def _scored(record: store.CellRecord) -> bool:
    """A finished seed: status ok with a finite score. A non-finite one (a record of an older
    version, which stored one) is none: counted, pandas' mean and std would skip it while the
    cell read complete; it counts as diverged."""
    return record.status == store.STATUS_OK and record.score is not None and math.isfinite(record.score)


def _summary_row(
    records: list[store.CellRecord], asked: int, outliers: dict[CellKey, str], level: float, spread_limit: float
) -> dict[str, Any]:
    """The summary of one (task, method) cell from its records, ``p_vs_best`` still NaN."""
    task, method = records[0].task, records[0].method
    scores = {r.seed: float(r.score) for r in records if _scored(r)}
    values = pd.Series(list(scores.values()), dtype=float)
    failed = sum(r.status == store.STATUS_FAILED for r in records)
    non_finite = sum(r.status == store.STATUS_OK and r.score is not None and not _scored(r) for r in records)
    diverged = sum(r.status == store.STATUS_DIVERGED for r in records) + non_finite
    not_applicable = not scores and any(r.status == store.STATUS_NA for r in records)
    low, high = t_interval(list(scores.values()), level)
    std = values.std() if len(values) else math.nan
    cut_short = any(r.cut_short for r in records if _scored(r))
    return {
        "task": task,
        "method": method,
        "metric": records[0].metric_label,
        "higher_is_better": bool(records[0].higher_is_better),
        "mean": values.mean() if len(values) else math.nan,
        "std": std,
        "n": len(scores),
        "asked": asked,
        "failed": failed,
        "diverged": diverged,
        "status": _status(len(scores), asked, failed, diverged, not_applicable),
        "config_ok": not any((task, method, seed) in outliers for seed in scores),
        "wide_spread": bool(std > spread_limit),  # NaN (one seed) compares False
        "ci_low": low,
        "ci_high": high,
        "p_vs_best": math.nan,
        "cut_short": cut_short,
        "scores": scores,
    }


def ranked(frame: pd.DataFrame) -> pd.Series:
    """Which rows may be ranked: complete (every seed, each trained to the end of its
    schedule), of their task's configuration, with a mean."""
    return (
        (frame["status"] == store.STATUS_OK)
        & frame["config_ok"].astype(bool)
        & ~frame["cut_short"].astype(bool)
        & frame["mean"].notna()
    )


def best_cells(frame: pd.DataFrame) -> dict[str, Any]:
    """task -> row index of its best ranked cell (the first of equal means)."""
    best = {}
    eligible = frame[ranked(frame)] if not frame.empty else frame
    for task, group in eligible.groupby("task", sort=False):
        means = group["mean"]
        best[task] = means.idxmax() if bool(group["higher_is_better"].iloc[0]) else means.idxmin()
    return best


# --- the matrix ----------------------------------------------------------------------------


def _pivot(stats: pd.DataFrame, column: str, methods: list[str], tasks: list[str]) -> pd.DataFrame:
    return stats.pivot(index="method", columns="task", values=column).reindex(index=methods, columns=tasks)


def matrix(
    results: StoredResults | Iterable[store.CellRecord], stats: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """(means, stds) frames with methods as rows and task columns, plus column -> metric label.

    ``means.attrs``: ``status``, ``ranked`` (frames like ``means``) and ``better`` (column ->
    higher is better). The Average column covers the higher-is-better columns, for methods
    with a ranked cell (complete, of the task's configuration) in each.
    """
    stats = summary(results) if stats is None else stats
    tasks = list(dict.fromkeys(stats["task"]))
    methods = list(dict.fromkeys(stats["method"]))
    stats = stats.assign(ranked=ranked(stats) if not stats.empty else [])
    means = _pivot(stats, "mean", methods, tasks)
    stds = _pivot(stats, "std", methods, tasks)
    status = _pivot(stats, "status", methods, tasks)
    rankable = _pivot(stats, "ranked", methods, tasks).eq(True)
    labels = dict(zip(stats["task"], stats["metric"], strict=False))
    better = {t: bool(b) for t, b in zip(stats["task"], stats["higher_is_better"], strict=False)}
    averaged = [t for t in tasks if better.get(t, True)]
    if averaged:
        complete = rankable[averaged].all(axis=1)
        means[AVERAGE] = means[averaged].mean(axis=1).where(complete)
        stds[AVERAGE] = math.nan
        status[AVERAGE] = store.STATUS_OK
        rankable[AVERAGE] = means[AVERAGE].notna()
        better[AVERAGE] = True
        labels[AVERAGE] = ""
    means.attrs.update(status=status, ranked=rankable, better=better)
    return means, stds, labels


def _emphasis(
    means: pd.Series, eligible: pd.Series, p_values: pd.Series | None, higher: bool, alpha: float
) -> dict[str, str]:
    """method -> "bold" or "under" for one column. Bold: the best (ties at the printed two
    decimals share it) and, given p-values, every eligible cell with p ≥ alpha; underlined:
    the best of the other eligible cells."""
    # The printed text's own rounding (format's, of the exact binary value), not pandas'
    # round, which differs next to a .xx5: two cells printed alike got one bold, one underlined.
    shown = means[eligible].map(lambda mean: float(f"{mean:.2f}"))
    if len(shown) < 2:
        return {}
    top = shown.max() if higher else shown.min()
    bold = set(shown.index[shown == top])
    if p_values is not None:
        bold |= {m for m in shown.index if not pd.isna(p_values[m]) and p_values[m] >= alpha}
    rest = shown.drop(index=list(bold))
    marks = dict.fromkeys(bold, "bold")
    if len(rest):
        second = rest.max() if higher else rest.min()
        marks.update(dict.fromkeys(rest.index[rest == second], "under"))
    return marks


def seed_marks(config_ok: bool, cut_short: bool) -> str:
    """The marks a cell's seeds earn, in the matrix's order: `` †`` (a seed of another
    configuration) and `` §`` (a seed cut short). Every table that shows matrix cells uses it."""
    return ("" if config_ok else " †") + (f" {CUT_MARK}" if cut_short else "")


def _value_text(row: pd.Series, ci: float | None) -> str:
    """The plain text of one cell (Unicode ± and †; the format adds emphasis and escaping)."""
    if row["status"] == store.STATUS_NA:
        return "n/a"
    asked = int(row["asked"])
    if row["n"] == 0:
        words = [w for w, count in (("failed", row["failed"]), ("diverged", row["diverged"])) if count]
        return f"{'/'.join(words) or '-'} (0/{asked})"
    text = f"{row['mean']:.2f}"
    if ci is not None and row["n"] >= 2:
        text += f" ± {row['ci_high'] - row['mean']:.2f}"
    elif ci is None and not pd.isna(row["std"]):
        text += f" ± {row['std']:.2f}"
    if row["n"] < asked:
        text += f" ({int(row['n'])}/{asked})"
    text += seed_marks(row["config_ok"], row["cut_short"])
    if row["wide_spread"]:
        text += " ‡"
    return text


@dataclass(frozen=True)
class _Table:
    """A rendered matrix before formatting: plain-text cells, their emphasis, notes."""

    header: list[str]
    rows: list[tuple[str, list[str], list[str]]]  # method, cell texts, emphasis ("", bold, under)
    caption: str
    notes: list[str]


def _build(
    results: StoredResults | Iterable[store.CellRecord],
    ci: float | None = None,
    significance: bool = True,
    alpha: float = ALPHA,
    spread_limit: float = SPREAD_LIMIT,
) -> _Table | None:
    """The matrix as plain text with emphasis and notes; None when there is nothing to show."""
    results = as_results(results)
    check = check_configs(results)
    stats = summary(results, ci, check, spread_limit)
    means, stds, labels = matrix(results, stats)
    if means.empty:
        return None
    better, rankable = means.attrs["better"], means.attrs["ranked"]
    by_cell = stats.set_index(["method", "task"])
    tested = significance and bool((stats["p_vs_best"].notna() & ranked(stats)).any())
    emphasis: dict[str, dict[str, str]] = {}
    for column in means.columns:
        p_values = None
        if tested and column != AVERAGE:
            p_values = stats[stats["task"] == column].set_index("method")["p_vs_best"].reindex(means.index)
        emphasis[column] = _emphasis(means[column], rankable[column], p_values, better.get(column, True), alpha)
    rows = []
    for method in means.index:
        texts, marks = [], []
        for column in means.columns:
            if column == AVERAGE:
                value = means.loc[method, AVERAGE]
                texts.append("-" if pd.isna(value) else f"{value:.2f}")
            elif (method, column) in by_cell.index:
                texts.append(_value_text(by_cell.loc[(method, column)], ci))
            else:
                texts.append("-")
            marks.append(emphasis[column].get(method, ""))
        rows.append((method, texts, marks))
    header = [f"{c} {labels[c]}{'' if better.get(c, True) else ' ↓'}".strip() for c in means.columns]
    profiles = sorted({r.profile for r in results.records})
    caption = f"Result matrix, {', '.join(profiles)} profile. " + _spread_note(ci)
    notes = _notes(results, stats, check, tested, significance, alpha, AVERAGE in means.columns, spread_limit)
    return _Table(header, rows, caption, notes)


def _spread_note(ci: float | None) -> str:
    if ci is None:
        return "Mean ± std over seeds (a value without ± is one seed)."
    return (
        f"Mean ± half-width of the {ci * 100:g}% Student-t confidence interval over seeds "
        "(n − 1 degrees of freedom; a value without ± is one seed)."
    )


def _notes(
    results: StoredResults,
    stats: pd.DataFrame,
    check: ConfigCheck,
    tested: bool,
    significance: bool,
    alpha: float,
    averaged: bool,
    spread_limit: float,
) -> list[str]:
    notes = [_seeds_note(asked_seeds(results))]
    missing = _missing_note(stats)
    if missing:
        notes.append(missing)
    notes.append(_ranking_note(tested, significance, alpha))
    if averaged:
        notes.append("Average: over the higher-is-better columns, for methods with a ranked cell in each.")
    if check.task_differences:
        notes.append(
            "† another configuration than the rest of its task (not ranked): " + _grouped(check.task_differences) + "."
        )
    if check.option_differences:
        notes.append(
            "† seeds of one method trained with other method options, averaged in one cell (not ranked): "
            + _grouped(check.option_differences)
            + "."
        )
    if stats["cut_short"].any():
        notes.append(_cut_note(results))
    if stats["wide_spread"].any():
        notes.append(_spread_mark_note(stats, spread_limit))
    for task in check.ties:
        notes.append(f"{task}: no configuration is shared by most cells; the first one found is taken as the task's.")
    if results.incomplete:
        notes.append(_incomplete_note(results))
    if any(r.profile == "tiny" for r in results.records):
        notes.append(_tiny_footnote(sorted({r.task for r in results.records})))
    return notes


def _grouped(differences: dict[CellKey, str]) -> str:
    """``task/method/seed0,2: difference; ...``: the seeds of a cell that differ alike, together."""
    grouped: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for (task, method, seed), difference in differences.items():
        grouped[(task, method, difference)].append(seed)
    return "; ".join(
        f"{task}/{method}/seed{','.join(map(str, sorted(seeds)))}: {difference}"
        for (task, method, difference), seeds in grouped.items()
    )


def _cut_note(results: StoredResults) -> str:
    parts = [f"{_cell_name(_key(r))}: {r.schedule_text()}" for r in results.records if _scored(r) and r.cut_short]
    return (
        f"{CUT_MARK} a seed whose training stopped before its planned epochs: the cell holds a shorter "
        "schedule's score (not ranked, not in the Average; trainer.max_time stops training quietly and the best "
        "checkpoint so far is tested): " + "; ".join(parts) + "."
    )


def _spread_mark_note(stats: pd.DataFrame, spread_limit: float) -> str:
    wide = stats[stats["wide_spread"]]
    seeds = "; ".join(
        f"{row['task']}/{row['method']} " + " / ".join(f"{score:.1f}" for _, score in sorted(row["scores"].items()))
        for _, row in wide.iterrows()
    )
    return (
        f"‡ seeds spread by more than {spread_limit:g} (std, in the metric's units): the mean ranks little, and a "
        f"cell that wide can be bold for its spread alone; run more seeds before reading it. Per seed: {seeds}."
    )


def _incomplete_note(results: StoredResults) -> str:
    parts = [f"{_cell_name(key)} ({why})" for key, why in sorted(results.incomplete.items())]
    return "Left out, incomplete cell: " + "; ".join(parts) + "."


def _seeds_note(asked: dict[str, list[int]]) -> str:
    described = {task: ", ".join(map(str, seeds)) for task, seeds in asked.items()}
    if len(set(described.values())) == 1:
        seeds = next(iter(asked.values()))
        where = f"{len(seeds)} seed(s) asked for in every task ({next(iter(described.values()))})"
    else:
        where = "seeds asked for: " + "; ".join(f"{t} {len(asked[t])} ({s})" for t, s in described.items())
    return (
        f"Seeds: {where}. A cell holding fewer shows (held/asked); "
        "one without any finished seed says why (failed, diverged)."
    )


def _missing_note(stats: pd.DataFrame) -> str:
    parts = []
    for _, row in stats[stats["status"] == STATUS_PARTIAL].iterrows():
        not_run = int(row["asked"] - row["n"] - row["failed"] - row["diverged"])
        counts = (("failed", row["failed"]), ("diverged", row["diverged"]), ("not run or left out", not_run))
        why = [f"{count} {word}" for word, count in counts if count > 0]
        parts.append(f"{row['task']}/{row['method']} {', '.join(why)}")
    return ("Missing seeds: " + "; ".join(parts) + ".") if parts else ""


def _ranking_note(tested: bool, significance: bool, alpha: float) -> str:
    eligible = (
        "Only complete cells of the task's configuration are ranked: a cell with missing seeds (held/asked) "
        "or another configuration (†) is never marked, whatever its value."
    )
    if tested:
        how = (
            "Bold: the best cell and every ranked cell not significantly different from it (two-sided paired "
            f"t-test over the seeds both hold, α = {alpha:g}, not corrected for multiple comparisons; no test "
            "with fewer than 2 shared seeds); underlined: the best of the rest."
        )
    elif significance:
        how = "Best in bold, next-best underlined (no paired test: no two ranked cells share 2 or more seeds)."
    else:
        how = "Best in bold, next-best underlined (by mean alone, no significance test)."
    return f"{how} {eligible}"


def _tiny_footnote(tasks: list[str]) -> str:
    from pe_bench.tasks import get_task

    parts = []
    for name in tasks:
        try:
            standin = get_task(name).tiny_standin
        except KeyError:
            continue
        if standin:
            parts.append(f"{name}: {standin}")
    return "tiny profile: small stand-ins, not the real datasets - " + "; ".join(parts) + "."


# --- formats -------------------------------------------------------------------------------


def _markdown(table: _Table) -> str:
    wrap = {"bold": "**{}**", "under": "<u>{}</u>", "": "{}"}
    cells = pd.DataFrame(
        [[wrap[m].format(t) for t, m in zip(texts, marks, strict=True)] for _, texts, marks in table.rows],
        index=pd.Index([method for method, _, _ in table.rows], name="Position encoding"),
        columns=table.header,
    )
    body = cells.to_markdown(disable_numparse=True)
    return body + "\n\n" + "\n\n".join([table.caption, *table.notes])


def _tex(text: str) -> str:
    """``latex.escape``, with the cut-short mark as a superscript section sign (like † and ‡)."""
    return r"$^\S$".join(latex.escape(part) for part in text.split(CUT_MARK))


def _latex(table: _Table) -> str:
    wrap = {"bold": r"\textbf{{{}}}", "under": r"\underline{{{}}}", "": "{}"}
    rows = [
        [_tex(method)] + [wrap[m].format(_tex(t)) for t, m in zip(texts, marks, strict=True)]
        for method, texts, marks in table.rows
    ]
    header = [_tex("Position encoding")] + [_tex(h) for h in table.header]
    return latex.booktabs_table(header, rows, _tex(table.caption), [_tex(n) for n in table.notes])


def render(
    results: StoredResults | Iterable[store.CellRecord],
    fmt: str = "markdown",
    ci: float | None = None,
    significance: bool = True,
    alpha: float = ALPHA,
    spread_limit: float = SPREAD_LIMIT,
) -> str:
    """The matrix as Markdown (``fmt="markdown"``) or a LaTeX booktabs float (``"latex"``).

    ``ci``: show ± the half-width of this Student-t confidence interval (e.g. 0.95) instead of
    ± std. ``significance``: bold every ranked cell not significantly different from the best.
    ``spread_limit``: mark ‡ every cell whose seeds' std exceeds it (``math.inf``: never).
    """
    if fmt not in ("markdown", "latex"):
        raise ValueError(f"unknown table format {fmt!r}; use 'markdown' or 'latex'")
    results = as_results(results)
    table = _build(results, ci, significance, alpha, spread_limit)
    if table is None:
        empty = "(no results yet)" + (f"\n\n{_incomplete_note(results)}" if results.incomplete else "")
        return empty if fmt == "markdown" else "".join(f"% {line}\n" for line in empty.splitlines() if line)
    return _markdown(table) if fmt == "markdown" else _latex(table)


def write_tables(
    out: Path,
    ci: float | None = None,
    significance: bool = True,
    alpha: float = ALPHA,
    spread_limit: float = SPREAD_LIMIT,
    results: StoredResults | None = None,
) -> str:
    """Write table.md, table.tex and table.csv under ``out`` from its stored cells (``results``:
    those already loaded from ``out``); return the Markdown."""
    out = Path(out)
    results = load_results(out) if results is None else results
    markdown = render(results, "markdown", ci, significance, alpha, spread_limit)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(markdown + "\n")
    (out / "table.tex").write_text(render(results, "latex", ci, significance, alpha, spread_limit))
    summary(results, ci, spread_limit=spread_limit)[SUMMARY_COLUMNS].to_csv(out / "table.csv", index=False)
    return markdown


def render_extra_table(frame: pd.DataFrame) -> str:
    """Markdown of a task's extra table: each ``X_mean``/``X_std`` column pair becomes one
    column ``X`` reading "mean ± std" (the mean alone for a single seed, "-" when empty)."""
    shown = pd.DataFrame(index=frame.index)
    for column in frame.columns:
        if column.endswith("_std") and f"{column[:-4]}_mean" in frame.columns:
            continue
        if column.endswith("_mean") and f"{column[:-5]}_std" in frame.columns:
            means, stds = frame[column], frame[f"{column[:-5]}_std"]
            shown[column[:-5]] = [
                "-" if pd.isna(m) else (f"{m:.1f} ± {s:.1f}" if s and s > 0 else f"{m:.1f}")
                for m, s in zip(means, stds, strict=True)
            ]
        else:
            shown[column] = frame[column]
    title = frame.attrs.get("title")
    table = shown.to_markdown(index=False, disable_numparse=True)
    return f"{title}\n\n{table}" if title else table


def extra_tables(results: StoredResults | Iterable[store.CellRecord]) -> dict[str, pd.DataFrame]:
    """Every task's own tables (``Task.extra_tables``) by name, from the seeds the matrix
    averages: every finished seed with a finite score (a cell left out as incomplete is not in
    ``results``), a ``†`` or ``§`` seed included and marked, as in the matrix. A table with
    ``task``, ``method`` and ``seeds`` columns (rows of result-matrix cells; ``seeds``: how many
    of the cell's seeds a row averages) follows the matrix's rules (README "Honest tables"):
    ``seeds`` reads ``held/asked`` where it holds fewer than asked, with the cell's ``†`` and
    ``§``, and the title carries the matrix's notes on those cells (seeds asked for, the missing
    ones and why, the ``†`` keys, the ``§`` schedules). Until stop 71 the bins table dropped
    ``†`` and ``§`` seeds and showed the rest unmarked: another seed set than the matrix's,
    read as complete. A table that several tasks share appears once."""
    from pe_bench.tasks import get_task, implemented

    results = as_results(results)
    finished = [r for r in results.records if _scored(r)]
    tables: dict[str, pd.DataFrame] = {}
    for name in sorted({r.task for r in finished} & set(implemented())):
        for table_name, frame in get_task(name).extra_tables(finished).items():
            if table_name not in tables:
                tables[table_name] = _as_the_matrix_shows(frame, results)
    return tables


def _as_the_matrix_shows(frame: pd.DataFrame, results: StoredResults) -> pd.DataFrame:
    """``frame`` with each row's ``seeds`` as the matrix shows its cell (``held/asked``, ``†``,
    ``§``) and the matrix's notes under its title; a table without ``task``, ``method`` and
    ``seeds`` columns unchanged. No ``‡``: a row shows its own spread, column by column."""
    if frame.empty or not {"task", "method", "seeds"} <= set(frame.columns):
        return frame
    results = select_tasks(results, list(dict.fromkeys(frame["task"])))
    check = check_configs(results)
    stats = summary(results, check=check, spread_limit=math.inf)
    cells = stats.set_index(["task", "method"])
    texts, fewer = [], {}
    for task, method, held in zip(frame["task"], frame["method"], frame["seeds"], strict=True):
        cell, held = cells.loc[(task, method)], int(held)
        text = str(held) if held >= cell["asked"] else f"{held}/{int(cell['asked'])}"
        texts.append(text + seed_marks(cell["config_ok"], cell["cut_short"]))
        if held < cell["n"]:  # one row per evaluation set: the fewest seeds any of them holds
            fewest = min(held, fewer[(task, method)][0]) if (task, method) in fewer else held
            fewer[(task, method)] = (fewest, int(cell["n"]))
    shown = frame.copy()
    shown["seeds"] = texts
    rows = set(zip(frame["task"], frame["method"], strict=True))
    ranking = _ranking_note(False, False, ALPHA)
    notes = [note for note in _notes(results, stats, check, False, False, ALPHA, False, math.inf) if note != ranking]
    notes.insert(
        1,
        "Each row: mean ± std over the seeds its result-matrix cell averages (a † or § seed included, as there); "
        "seeds: how many, held/asked where fewer than asked, with the cell's marks. Nothing is ranked: a row with "
        "missing seeds, another configuration (†) or a seed cut short (§) does not compare with the complete, "
        "unmarked ones.",
    )
    if fewer:
        notes.append(
            "Fewer seeds than the matrix's cell (its other finished seeds stored no numbers for this table): "
            + "; ".join(f"{task}/{method} {held} of {n}" for (task, method), (held, n) in fewer.items())
            + "."
        )
    absent = [
        f"{task}/{method} {_value_text(cell, None) if cell['n'] == 0 else 'none of its seeds stored these numbers'}"
        for (task, method), cell in cells.iterrows()
        if (task, method) not in rows
    ]
    if absent:
        notes.append("No row: " + "; ".join(absent) + ".")
    title = frame.attrs.get("title")
    shown.attrs = {**frame.attrs, "title": "\n\n".join([title, *notes] if title else notes)}
    return shown


def write_extra_tables(out: Path, results: StoredResults | Iterable[store.CellRecord] | None = None) -> list[str]:
    """``extra_tables`` of ``results`` (default: those stored under ``out``, as the matrix reads
    them) as ``<out>/<name>.md`` and ``.csv``; returns their Markdown."""
    written = []
    for table_name, frame in extra_tables(load_results(out) if results is None else results).items():
        written.append(render_extra_table(frame))
        (Path(out) / f"{table_name}.md").write_text(written[-1] + "\n")
        frame.to_csv(Path(out) / f"{table_name}.csv", index=False)
    return written
