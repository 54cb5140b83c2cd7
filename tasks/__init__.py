"""Tasks: one folder per task family, and the task registry with its groups.

Built-in tasks are declared in ``configs/tasks/<name>.yaml`` (``implementation: module:Class``)
and imported on first use; plug-in tasks come from the ``pe_bench.tasks`` entry-point group.
"""

from .base import TASKS, PatchTask, Task, get_task, groups, implemented, planned, resolve_tasks

__all__ = ["TASKS", "PatchTask", "Task", "get_task", "groups", "implemented", "planned", "resolve_tasks"]
