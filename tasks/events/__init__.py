"""Event-camera classification with Spiking Patches tokens and a ViT: dvsgesture.

The tasks are declared in ``configs/tasks/<name>.yaml`` (``implementation:``) and imported
on first use."""
