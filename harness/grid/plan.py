"""What a grid would do, cell by cell, without training anything (``pe-bench run --dry-run``).

The decisions are those of ``run_grid``: a finished cell (ok or n/a) of the same profile and
configuration is reused, a failed or diverged one is trained again, a finished cell of
another configuration stops the grid, and a method that does not apply to a task's
geometry is recorded as n/a without training.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pe_bench.tasks import get_task

from . import store
from .runner import GridRequest, requested_cell_config, requested_run_config, stored_config_differences

TRAIN, REUSE, RETRY, NOT_APPLICABLE, CONFLICT = "train", "reuse", "retry", "n/a", "conflict"


@dataclass(frozen=True)
class PlannedCell:
    task: str
    method: str
    seed: int
    action: str  # one of TRAIN, REUSE, RETRY, NOT_APPLICABLE, CONFLICT
    detail: str = ""


def plan_grid(request: GridRequest) -> list[PlannedCell]:
    """Every cell of ``request`` with what running it would do."""
    planned = []
    for task_name in request.tasks:
        config = requested_run_config(request, task_name)
        task = get_task(task_name)(config, request.data_root)
        for method in request.methods:
            requested = requested_cell_config(config, method)
            not_applicable = method.encoding(config.methods.get(method.name)).unsupported_reason(task.geometry())
            for seed in request.seeds:
                cell = store.cell_dir(request.out, task_name, method.label, seed)
                action, detail = _decide(cell, request.profile, requested, not_applicable)
                planned.append(PlannedCell(task_name, method.label, seed, action, detail))
    return planned


def _decide(cell, profile: str, requested: dict, not_applicable: str | None) -> tuple[str, str]:
    # store.read_cell, as the run reads the cell (claim_and_run): a dry run must say what
    # the run then does, e.g. retrain a trained cell whose config.yaml is missing.
    stored = store.read_cell(cell)
    existing = stored.record
    if existing is None:
        if stored.problem:
            return RETRY, stored.problem
        return (NOT_APPLICABLE, not_applicable) if not_applicable else (TRAIN, "")
    if existing.profile != profile:
        return CONFLICT, f"holds {existing.profile!r}-profile results"
    if existing.status == store.STATUS_NA:
        return REUSE, f"n/a: {existing.reason}"
    if existing.status != store.STATUS_OK:
        return RETRY, f"last time {existing.status}: {existing.reason.splitlines()[0][:120]}"
    if stored.problem:
        return RETRY, stored.problem
    differences = stored_config_differences(stored.config, requested)
    if differences:
        more = f"; {len(differences) - 2} more" if len(differences) > 2 else ""
        return CONFLICT, "trained with another configuration: " + "; ".join(differences[:2]) + more
    return REUSE, f"finished: {existing.metric_label} {existing.score:.2f}"


def format_plan(request: GridRequest, planned: list[PlannedCell]) -> str:
    lines = [
        f"dry run: {len(planned)} cells ({len(request.tasks)} tasks x {len(request.methods)} methods x "
        f"{len(request.seeds)} seeds), {request.profile} profile, results in {request.out}/"
    ]
    for cell in planned:
        where = f"{cell.task} · {cell.method} · seed {cell.seed}"
        lines.append(f"  {cell.action:9s}{where}" + (f"  ({cell.detail})" if cell.detail else ""))
    counts = Counter(cell.action for cell in planned)
    summary = ", ".join(f"{counts[a]} {a}" for a in (TRAIN, RETRY, REUSE, NOT_APPLICABLE, CONFLICT) if counts[a])
    lines.append(f"would do: {summary or 'nothing'}")
    if counts[CONFLICT]:
        lines.append(
            "the run would stop at the conflicting cells: use another --out for this setting, "
            "or delete those cells to retrain them"
        )
    return "\n".join(lines)
