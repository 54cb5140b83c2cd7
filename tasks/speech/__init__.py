"""Speech recognition with a CTC transformer: wsj, tedlium.

Importing the package registers its tasks."""

from . import task  # noqa: F401  (registers the tasks)
