"""Which keys of two cell configurations can make their results differ.

One rule for the two places that compare configurations: the grid runner (may a finished
cell be reused for what is asked now?) and the tables (was every cell of a task trained the
same way?). Both read config.yaml files written by different versions of the code, so a key
present in one file only is common. It is no difference only where that is provable:

* a retired key (removed from the code, :data:`RETIRED_KEYS`) stored at the value with which
  cells ran exactly as cells without it do;
* a current field of a typed section (``model``, ``optim``, ``trainer``) at its default: a
  field is added with the default that keeps the earlier behaviour, so a file written before
  it existed ran as that default does. At any other value it is a difference (a profile that
  sets a new field must not reuse cells trained before the field existed).

Anything else one-sided (an unknown key, a free-form ``data`` or ``options`` key) differs.

The ``effective`` section (how ``trainer``'s settings took effect where a cell ran: precision,
compile and world size after ``auto`` resolved, grid/runner.py's ``effective_trainer``, and
since stop 71 the CPU threads it trained with, which ``trainer.threads: null`` leaves to the machine; and
``effective.data``, the versions that made the cell's data and metric, ``Task.data_fingerprint``)
is compared key by key only between two files that both hold the key: a requested
configuration has not run yet, and cells stored before a key existed do not say. So is
``resolved_options`` (every option of the cell's encoding, its defaults included, since stop
71): ``options`` holds only the options given, and a default the code changed later would
otherwise leave two trainings of ``pape`` looking alike; files from before it do not say.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from .config import RETIRED_KEYS, OptimConfig, TrainerConfig, model_config_for

#: Keys that cannot change a result: experiment trackers only watch the run. Not num_workers: the
#: shuffle order is seeded, but each data-loader worker draws random augmentations from its own
#: stream, so 0 and 4 workers crop and flip differently. Device, precision, thread and time-cap
#: keys change the arithmetic or where training stops.
RESULT_NEUTRAL_KEYS = frozenset({"trainer.logger"})
TYPED_SECTIONS = ("model", "optim", "trainer")
ABSENT = object()  # a key the file does not hold
EFFECTIVE = "effective"  # config.yaml's section of how the trainer's settings resolved
#: config.yaml's section of every option the cell's encoding ran with, defaults included
#: (``options`` holds only those given). Compared like ``effective``: where both files hold a
#: key, so that a default changed in the code between two trainings is a difference.
RESOLVED_OPTIONS = "resolved_options"


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys (an empty dict contributes no key)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def canonical(value: Any) -> str:
    """A value as comparable, hashable text (key order of dicts does not matter)."""
    return json.dumps(value, sort_keys=True, default=str)


def field_default(task: str, dotted: str) -> Any:
    """The current code's default of a typed-section key, or ABSENT if it is no field."""
    section, _, rest = dotted.partition(".")
    schema = {"model": model_config_for(task), "optim": OptimConfig, "trainer": TrainerConfig}.get(section)
    if schema is None or not rest:
        return ABSENT
    name, _, inner = rest.partition(".")
    field = schema.model_fields.get(name)
    if field is None or field.is_required():
        return ABSENT
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    for part in inner.split(".") if inner else ():
        if not isinstance(value, dict) or part not in value:
            return ABSENT
        value = value[part]
    return value


def one_sided_is_no_change(task: str, dotted: str, value: Any) -> bool:
    """Whether a typed-section key held by one configuration only, at ``value``, changes nothing."""
    if dotted.split(".")[0] not in TYPED_SECTIONS:
        return False
    if dotted in RETIRED_KEYS:
        return canonical(value) == canonical(RETIRED_KEYS[dotted])
    default = field_default(task, dotted)
    return default is not ABSENT and canonical(default) == canonical(value)


def result_keys(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` flattened to dotted keys, without those that cannot change a result."""
    return {
        key: value
        for key, value in flatten(tree).items()
        if not any(key == neutral or key.startswith(f"{neutral}.") for neutral in RESULT_NEUTRAL_KEYS)
    }


def config_differences(task: str, mine: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, my value, their value)`` for every result-relevant key that differs
    (ABSENT where a file lacks the key). Callers drop the keys they do not compare first
    (the runner: every method's options; the tables: everything that belongs to the method)."""
    a, b = result_keys(mine), result_keys(theirs)
    differences = []
    for key in sorted(set(a) | set(b)):
        if (key in a) != (key in b) and (
            key.startswith((f"{EFFECTIVE}.", f"{RESOLVED_OPTIONS}."))
            or one_sided_is_no_change(task, key, a.get(key, b.get(key)))
        ):
            continue
        mine_value, their_value = a.get(key, ABSENT), b.get(key, ABSENT)
        if mine_value is ABSENT or their_value is ABSENT or canonical(mine_value) != canonical(their_value):
            differences.append((key, mine_value, their_value))
    return differences
