"""Position encodings behind one protocol, and their registry.

Importing this package registers the built-in encodings; plug-ins from other packages are
discovered through the ``pe_bench.encodings`` entry-point group on first lookup.
"""

import importlib
import pkgutil

import torch

from pe_bench.requirements import check_torch

from .base import (
    AttentionInputs,
    EncodingOptions,
    Geometry,
    LayerEncoding,
    NotApplicableError,
    PositionEncoding,
    PositionLayout,
    Principle,
)
from .registry import ENCODINGS, EncodingFactory, UnknownEncodingError, available, build, get, register

# an older torch fails later, deep inside a compile; here it is named
check_torch(torch.__version__)

# Every module of this package other than the protocol itself is one built-in encoding:
# importing it runs its @register. Adding an encoding is adding a file.
_INFRASTRUCTURE = {"base", "registry", "transforms"}
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _INFRASTRUCTURE and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "AttentionInputs",
    "ENCODINGS",
    "EncodingFactory",
    "EncodingOptions",
    "Geometry",
    "LayerEncoding",
    "NotApplicableError",
    "PositionEncoding",
    "PositionLayout",
    "Principle",
    "UnknownEncodingError",
    "available",
    "build",
    "get",
    "register",
]
