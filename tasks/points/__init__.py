"""Point clouds with a Point Transformer V3-style network: modelnet40, scannet.

The tasks are declared in ``configs/tasks/<name>.yaml`` (``implementation:``) and imported
on first use."""
