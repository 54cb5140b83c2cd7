"""Image classification with a ViT: imagenet, cifar10, cifar100.

Importing the package registers its tasks."""

from . import task  # noqa: F401  (registers the tasks)
