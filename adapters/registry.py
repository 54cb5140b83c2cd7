"""Name -> encoding class, and the factory that backbones build encodings with.

A package adds an encoding without editing pe-bench by declaring, in its pyproject.toml::

    [project.entry-points."pe_bench.encodings"]
    my-encoding = "my_package.my_module:MyEncoding"

The entry point may name the class itself or a module whose import registers it. The
registry itself is pe-bench's one generic :class:`~pe_bench.registry.Registry` (tasks use
the same type).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pe_bench.registry import Registry, UnknownNameError

from .base import EncodingOptions, Geometry, PositionEncoding
from .init_stream import encoding_draws

ENTRY_POINT_GROUP = "pe_bench.encodings"


class UnknownEncodingError(UnknownNameError):
    """An encoding name that is not registered."""


def _name_class(name: str, cls: type[PositionEncoding]) -> None:
    cls.name = name


ENCODINGS: Registry[type[PositionEncoding]] = Registry(
    "position encoding", PositionEncoding, ENTRY_POINT_GROUP, on_register=_name_class
)


def register(name: str) -> Callable[[type[PositionEncoding]], type[PositionEncoding]]:
    """Class decorator: ``@register("rope")`` makes the encoding available under ``name``."""
    return ENCODINGS.register(name)


def available() -> list[str]:
    """All registered encoding names, built-in and plug-in, sorted."""
    return ENCODINGS.names()


def get(name: str) -> type[PositionEncoding]:
    if name not in ENCODINGS:
        raise UnknownEncodingError(ENCODINGS.unknown_message(name))
    return ENCODINGS.get(name)


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


@dataclass(frozen=True)
class EncodingFactory:
    """One encoding with its options, ready to be built into any backbone.

    Backbones take this instead of a name and an options dict (timm's way of injecting
    ``attn_layer``/``block_fn``): ``make_encoding(geometry, dim, num_heads, depth)`` builds
    one :class:`PositionEncoding`; a backbone with several attention stacks (PTv3's stages,
    the translation encoder and decoder) calls it once per stack.

    Attributes:
        name: the registered encoding name ("pape").
        options: the options as given (task-profile defaults merged with the spec's own);
            validated on construction, stored as given so that a cell's config records them.
    """

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validated()  # an unknown name or a bad option fails here, before any model exists

    @property
    def cls(self) -> type[PositionEncoding]:
        return get(self.name)

    def validated(self) -> EncodingOptions:
        return self.cls.Options(**dict(self.options))

    def option(self, key: str, default: Any = None) -> Any:
        """An option's value as given, or ``default`` when the spec and profile leave it unset."""
        return self.options.get(key, default)

    def unsupported_reason(self, geometry: Geometry) -> str | None:
        return self.cls.unsupported_reason(geometry)

    def __call__(self, geometry: Geometry, dim: int, num_heads: int, depth: int) -> PositionEncoding:
        with encoding_draws():  # its own random stream under model.paired_init (init_stream.py)
            return self.cls(geometry=geometry, dim=dim, num_heads=num_heads, depth=depth, options=self.validated())
