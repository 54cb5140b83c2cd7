"""Machine translation with an encoder-decoder transformer: wmt14-en-de, wmt14-en-fr.

Importing the package registers its tasks."""

from . import task  # noqa: F401  (registers the tasks)
