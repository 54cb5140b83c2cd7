"""Tasks, one module per task family; importing this package registers them.

Every module here that is not infrastructure is imported, so that its ``@register_task``
classes register: adding a task family is adding a module.
"""

import importlib
import pkgutil

from .base import GROUPS, PLANNED, Task, get_task, implemented, register_task, resolve_tasks

_INFRASTRUCTURE = {"base"}
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _INFRASTRUCTURE and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["GROUPS", "PLANNED", "Task", "get_task", "implemented", "register_task", "resolve_tasks"]
