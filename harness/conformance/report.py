"""Run the conformance suite on one encoding and report declared versus measured principles.

For every probe geometry the encoding supports (:mod:`.probes`), :func:`measure` computes
the principle statistics (:mod:`.principles`) and then runs the protocol checks
(:mod:`.protocol`) on the first seed's model. A geometry the encoding declines
(``unsupported_reason`` or ``NotApplicableError`` at build) is listed as n/a. A claimed
principle must be measured on every supported geometry; an unclaimed one may or may not
hold. The verdict (:attr:`Report.verdict`) is one of

* ERROR: a build or a measurement raised (named in the report; every cell of the
  principles table reads "error (ExceptionType)"), never a pass;
* NOT CHECKED: no probe geometry applies, so nothing was measured, never a pass;
* FAIL: a claimed principle is not measured, or a protocol check failed;
* PASS: otherwise. ``Report.passed`` is True for PASS only (``pe-bench check`` exits 1
  otherwise).

When no instance could be built, the declaration is the class's ``principles``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from pe_bench.adapters import registry
from pe_bench.adapters.base import EncodingOptions, NotApplicableError, PositionEncoding, Principle

from .principles import CRITERIA, INVARIANCE_TOL, holds, measure_principles, worst
from .probes import PROBES, SEEDS, build_model
from .protocol import CheckResult, run_checks

__all__ = ["CheckResult", "PrincipleResult", "Report", "check", "clear_cache", "measure", "principles_table"]


@dataclass
class PrincipleResult:
    """Declared versus measured for one principle; ``measured`` None = not measurable here."""

    principle: Principle
    declared: bool
    measured: bool | None
    statistic: float | None
    per_geometry: dict[str, float] = field(default_factory=dict)
    criterion: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        """A claim must be measured; an unclaimed principle may or may not hold."""
        return not self.declared or self.measured is True

    @property
    def cell(self) -> str:
        mark = {True: "✓", False: "✗"}
        if self.measured is None:
            return "claimed ✓ (n/a)" if self.declared else "n/a"
        if self.declared == self.measured:
            return mark[self.measured]
        return f"claimed {mark[self.declared]} (measured {mark[self.measured]})"


@dataclass
class Report:
    """Everything :func:`measure` found for one encoding (and its options)."""

    encoding: str
    options: dict[str, Any]
    geometries: list[str] = field(default_factory=list)
    not_applicable: dict[str, str] = field(default_factory=dict)
    principles: dict[Principle, PrincipleResult] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def applicable(self) -> bool:
        return bool(self.geometries)

    @property
    def raised(self) -> list[CheckResult]:
        """The builds or measurements that raised (their message: "Exception: message")."""
        return [c for c in self.checks if c.name in _ERROR_STAGES and not c.passed]

    @property
    def errors(self) -> list[str]:
        """Builds or measurements that raised, as "stage @ geometry: Exception: message"."""
        return [f"{c.name} @ {c.geometry}: {c.message}" for c in self.raised]

    @property
    def verdict(self) -> str:
        """ "ERROR" (a build or measurement raised), "NOT CHECKED" (no probe geometry applies),
        "FAIL" or "PASS"."""
        if self.errors:
            return "ERROR"
        if not self.applicable:
            return "NOT CHECKED"
        return "FAIL" if self.failures() else "PASS"

    def principle_failures(self) -> list[str]:
        out = []
        for r in self.principles.values():
            if not r.ok:
                what = "cannot be measured on any supported geometry" if r.measured is None else "is not measured"
                out.append(f"{r.principle.value}: claimed but {what} ({_stat_text(r)}; needs {r.criterion})")
        return out

    def check_failures(self) -> list[str]:
        return [f"{c.name} @ {c.geometry}: {c.message}" for c in self.checks if not c.passed]

    def failures(self) -> list[str]:
        return self.principle_failures() + self.check_failures()

    @property
    def passed(self) -> bool:
        """Only a report that measured something on at least one geometry can pass."""
        return self.verdict == "PASS"

    def cells(self) -> dict[str, str]:
        if self.raised:
            kinds = sorted({c.message.split(":", 1)[0] for c in self.raised})
            return {p.value: f"error ({', '.join(kinds)})" for p in Principle}
        if not self.applicable:
            return {p.value: "n/a" for p in Principle}
        return {p.value: self.principles[p].cell for p in Principle}

    def format(self) -> str:
        opts = f" {json.dumps(self.options, sort_keys=True, default=str)}" if self.options else ""
        lines = [f"Conformance of {self.encoding!r}{opts}: {self.verdict} ({self.seconds:.1f} s)"]
        for err in self.errors:
            lines.append(f"  error: {err}")
        for probe in PROBES:
            if probe.key in self.geometries:
                lines.append(f"  geometry {probe.key}: {probe.description}")
            elif probe.key in self.not_applicable:
                lines.append(f"  geometry {probe.key}: n/a ({self.not_applicable[probe.key]})")
        if not self.applicable:
            lines.append("  not checked: no probe geometry applies to this encoding, so nothing was measured")
            return "\n".join(lines)
        lines.append("")
        lines.append(f"  {'principle':<24}{'claimed':<9}{'measured':<10}{'ok':<4}statistic (criterion)")
        for r in self.principles.values():
            claimed = "yes" if r.declared else "no"
            measured = "n/a" if r.measured is None else ("yes" if r.measured else "no")
            ok = "ok" if r.ok else "FAIL"
            per = ", ".join(f"{k} {v:.3g}" for k, v in r.per_geometry.items())
            detail = f"{_stat_text(r)} [{per}] ({r.criterion})" if per else f"n/a ({r.criterion})"
            lines.append(f"  {r.principle.value:<24}{claimed:<9}{measured:<10}{ok:<4}{detail}")
            if r.note:
                lines.append(f"  {'':<47}{r.note}")
        lines.append("")
        lines.append("  protocol checks:")
        for c in self.checks:
            lines.append(f"    [{'pass' if c.passed else 'FAIL'}] {c.name} @ {c.geometry}: {c.message}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _stat_text(r: PrincipleResult) -> str:
    return "no statistic" if r.statistic is None else f"statistic {r.statistic:.3g}"


def _options_key(options: Mapping[str, Any] | EncodingOptions | None) -> tuple[dict[str, Any], str]:
    data = options.model_dump() if isinstance(options, EncodingOptions) else dict(options or {})
    return data, json.dumps(data, sort_keys=True, default=str)


_CACHE: dict[tuple[str, str], Report] = {}
_ERROR_STAGES = ("build", "measure")


def clear_cache() -> None:
    """Forget every cached :func:`measure` result."""
    _CACHE.clear()


def measure(
    encoding: str | type[PositionEncoding],
    options: Mapping[str, Any] | EncodingOptions | None = None,
    *,
    seeds: tuple[int, ...] = SEEDS,
    use_cache: bool = True,
) -> Report:
    """Measure every principle and run every protocol check for one encoding.

    ``encoding`` is a registered name or a :class:`PositionEncoding` subclass (so a plug-in
    can be checked before it is registered). Results for registered names are cached per
    (name, options) for the process; ``clear_cache`` drops them.
    """
    cls = registry.get(encoding) if isinstance(encoding, str) else encoding
    name = encoding if isinstance(encoding, str) else (cls.name or cls.__name__)
    opts, opts_key = _options_key(options)
    cache_key = (name, opts_key)
    cacheable = use_cache and isinstance(encoding, str) and seeds == SEEDS
    if cacheable and cache_key in _CACHE:
        return _CACHE[cache_key]

    start = time.perf_counter()
    report = Report(encoding=name, options=opts)
    per_geometry: dict[Principle, dict[str, float]] = {p: {} for p in Principle}
    notes: dict[Principle, list[str]] = {p: [] for p in Principle}
    crashed: dict[Principle, bool] = {p: False for p in Principle}
    declared: frozenset[Principle] | None = None
    threads = torch.get_num_threads()
    # The probe tensors are tiny: one thread avoids OpenMP overhead and CPU contention.
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            for probe in PROBES:
                reason = cls.unsupported_reason(probe.geometry)
                if reason:
                    report.not_applicable[probe.key] = reason
                    continue
                try:
                    instance = build_model(cls, probe, options, SEEDS[0])
                except NotApplicableError as err:
                    report.not_applicable[probe.key] = str(err)
                    continue
                except Exception as err:
                    report.geometries.append(probe.key)
                    report.checks.append(CheckResult("build", probe.key, False, f"{type(err).__name__}: {err}"))
                    for p in Principle:
                        crashed[p] = True
                    continue
                if declared is None:
                    declared = frozenset(instance.encoding.claimed_principles())
                report.geometries.append(probe.key)
                try:
                    results, model = measure_principles(cls, probe, options, seeds)
                    ti = results.get(Principle.TRANSLATION_INVARIANCE, (None, ""))[0]
                    invariant = ti is not None and ti <= INVARIANCE_TOL
                    report.checks += run_checks(model, probe, translation_invariant=invariant)
                except Exception as err:
                    report.checks.append(CheckResult("measure", probe.key, False, f"{type(err).__name__}: {err}"))
                    for p in Principle:
                        crashed[p] = True
                    continue
                for p, (value, note) in results.items():
                    if value is None:
                        crashed[p] = True
                        report.checks.append(
                            CheckResult(
                                "measure",
                                probe.key,
                                False,
                                f"{note.removeprefix(probe.key + ': ')} (measuring {p.value})",
                            )
                        )
                    else:
                        per_geometry[p][probe.key] = value
                    if note:
                        notes[p].append(note if value is None else f"{probe.key}: {note}")
    finally:
        torch.set_num_threads(threads)

    if declared is None:  # nothing could be built: fall back on the class's declaration
        declared = frozenset(getattr(cls, "principles", frozenset()))
    for p in Principle:
        values = per_geometry[p]
        if crashed[p]:
            measured: bool | None = False
        elif not values:
            measured = None
        else:
            measured = all(holds(p, v) for v in values.values())
        statistic = worst(p, values.values()) if values else None
        report.principles[p] = PrincipleResult(
            principle=p,
            declared=p in declared,
            measured=measured if report.geometries else None,
            statistic=statistic,
            per_geometry=dict(values),
            criterion=CRITERIA[p],
            note="; ".join(notes[p]),
        )
    report.seconds = time.perf_counter() - start
    if cacheable:
        _CACHE[cache_key] = report
    return report


def check(encoding: str | type[PositionEncoding], options: Mapping[str, Any] | EncodingOptions | None = None) -> Report:
    """Same as :func:`measure`; ``check(name).format()`` is the readable report."""
    return measure(encoding, options)


def principles_table(methods: Iterable[str | tuple[str, str, Mapping[str, Any]]] | None = None) -> pd.DataFrame:
    """Rows = encodings, columns = principles; cells "✓", "✗", "n/a" or
    "claimed ✓ (measured ✗)" / "claimed ✗ (measured ✓)" where declaration and measurement differ.

    ``methods``: encoding names, or (row label, encoding name, options) for specs with options
    such as ``pape[m=8]``; default: every registered encoding with its default options."""
    entries = [(m, m, {}) if isinstance(m, str) else m for m in (registry.available() if methods is None else methods)]
    rows = {label: measure(name, options).cells() for label, name, options in entries}
    table = pd.DataFrame.from_dict(rows, orient="index", columns=[p.value for p in Principle])
    table.index.name = "encoding"
    return table
