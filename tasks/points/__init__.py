"""Point clouds with a Point Transformer V3-style network: modelnet40, scannet.

Importing the package registers its tasks."""

from . import task  # noqa: F401  (registers the tasks)
