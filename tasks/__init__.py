"""Tasks, one module per task family; importing this package registers them."""

from . import image  # noqa: F401  (registers imagenet, cifar10, cifar100)
from .base import GROUPS, PLANNED, Task, get_task, implemented, register_task, resolve_tasks

__all__ = ["GROUPS", "PLANNED", "Task", "get_task", "implemented", "register_task", "resolve_tasks"]
