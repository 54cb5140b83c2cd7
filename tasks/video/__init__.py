"""Video classification with ViViT: ucf101.

Importing the package registers its tasks."""

from . import task  # noqa: F401  (registers the tasks)
