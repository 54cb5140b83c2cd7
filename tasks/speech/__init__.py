"""Speech recognition with a CTC transformer: wsj, tedlium.

The tasks are declared in ``configs/tasks/<name>.yaml`` (``implementation:``) and imported
on first use."""
