"""Event-camera classification with Spiking Patches tokens and a ViT: dvsgesture.

Importing the package registers its tasks."""

from . import task  # noqa: F401  (registers the tasks)
