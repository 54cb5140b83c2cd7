"""Name -> encoding class, with plug-ins discovered through an entry-point group.

A package adds an encoding without editing pe-bench by declaring, in its pyproject.toml::

    [project.entry-points."pe_bench.encodings"]
    my-encoding = "my_package.my_module:MyEncoding"

The entry point may name the class itself or a module whose import registers it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from .base import EncodingOptions, Geometry, PositionEncoding

ENTRY_POINT_GROUP = "pe_bench.encodings"

_REGISTRY: dict[str, type[PositionEncoding]] = {}
_plugins_loaded = False


class UnknownEncodingError(KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def register(name: str) -> Callable[[type[PositionEncoding]], type[PositionEncoding]]:
    """Class decorator: ``@register("rope")`` makes the encoding available under ``name``."""

    def decorate(cls: type[PositionEncoding]) -> type[PositionEncoding]:
        if not (isinstance(cls, type) and issubclass(cls, PositionEncoding)):
            raise TypeError(f"@register({name!r}) expects a PositionEncoding subclass, got {cls!r}")
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"encoding name {name!r} is already registered by {existing.__module__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        loaded = entry.load()
        if isinstance(loaded, type) and issubclass(loaded, PositionEncoding) and entry.name not in _REGISTRY:
            register(entry.name)(loaded)


def available() -> list[str]:
    """All registered encoding names, built-in and plug-in, sorted."""
    _load_plugins()
    return sorted(_REGISTRY)


def get(name: str) -> type[PositionEncoding]:
    _load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        names = available()
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownEncodingError(
            f"unknown position encoding {name!r}.{hint} Registered encodings: {', '.join(names)}"
        ) from None


def parse_options(name: str, options: Mapping[str, Any] | None) -> EncodingOptions:
    """Validate ``options`` against the encoding's Options model (errors name the key)."""
    return get(name).Options(**dict(options or {}))


def build(
    name: str,
    geometry: Geometry,
    dim: int,
    num_heads: int,
    depth: int,
    options: Mapping[str, Any] | EncodingOptions | None = None,
) -> PositionEncoding:
    cls = get(name)
    if not isinstance(options, EncodingOptions):
        options = cls.Options(**dict(options or {}))
    return cls(geometry=geometry, dim=dim, num_heads=num_heads, depth=depth, options=options)
