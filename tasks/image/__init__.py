"""Image classification with a ViT: imagenet, cifar10, cifar100.

The tasks are declared in ``configs/tasks/<name>.yaml`` (``implementation:``) and imported
on first use."""
