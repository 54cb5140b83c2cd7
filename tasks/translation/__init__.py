"""Machine translation with an encoder-decoder transformer: wmt14-en-de, wmt14-en-fr.

The tasks are declared in ``configs/tasks/<name>.yaml`` (``implementation:``) and imported
on first use."""
