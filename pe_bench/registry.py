"""One registry type for everything pe-bench looks up by name: encodings and tasks.

Modelled on lm-evaluation-harness's registry: an entry is either an object registered by a
decorator, or a lazy ``"module:object"`` reference that is imported on first use; installed
packages add entries through an entry-point group, exactly as built-ins do. Every entry
remembers where it came from (its module, or the distribution of its entry point), so that
``pe-bench list`` can say so and name clashes can be reported.

Plug-ins are loaded on the first lookup. A plug-in that fails to import is reported (once,
as a warning naming the entry point and the error) and left out; it never breaks commands
that do not need it. A plug-in named like a built-in is ignored with a warning: the
built-in keeps its name, so that published results stay comparable.
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A name that is not registered; the message lists the names and a close match."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class PluginWarning(UserWarning):
    """A plug-in could not be loaded or clashes with a built-in name."""


@dataclass
class Entry(Generic[T]):
    name: str
    origin: str  # "pe_bench.adapters.rope" or "plug-in my-package 1.0 (my_pkg.mod:Obj)"
    target: str | None = None  # lazy "module:object", imported on first use
    value: T | None = None
    plugin: bool = False


class Registry(Generic[T]):
    """Name -> object, with lazy entries, entry-point plug-ins and "did you mean" errors.

    Args:
        kind: what the entries are, for messages ("position encoding", "task").
        base: the type every entry must be a subclass of.
        entry_point_group: where installed packages declare their entries.
        on_register: called with (name, object) when an entry is registered or first loaded
            (e.g. to set the object's ``name`` attribute).
    """

    def __init__(
        self,
        kind: str,
        base: type,
        entry_point_group: str,
        on_register: Callable[[str, T], None] | None = None,
    ) -> None:
        self.kind = kind
        self.base = base
        self.entry_point_group = entry_point_group
        self.on_register = on_register
        self._entries: dict[str, Entry[T]] = {}
        self._plugins_loaded = False
        self.broken_plugins: dict[str, str] = {}  # entry-point name -> why it did not load

    # -- registration ----------------------------------------------------------------------
    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: ``@REGISTRY.register("rope")``."""

        def decorate(obj: T) -> T:
            self._check_type(name, obj)
            existing = self._entries.get(name)
            if existing is not None and existing.value is not None and existing.value is not obj:
                raise ValueError(f"{self.kind} name {name!r} is already registered by {existing.origin}")
            self._entries[name] = Entry(name, origin=getattr(obj, "__module__", "?"), value=obj)
            if self.on_register:
                self.on_register(name, obj)
            return obj

        return decorate

    def add_lazy(self, name: str, target: str, origin: str | None = None) -> None:
        """Register ``"module:object"`` without importing it (imported on first ``get``)."""
        if ":" not in target:
            raise ValueError(f"lazy {self.kind} {name!r}: expected 'module:object', got {target!r}")
        existing = self._entries.get(name)
        if existing is not None and existing.target != target and existing.value is None:
            raise ValueError(f"{self.kind} name {name!r} is already declared by {existing.origin}")
        if existing is None:
            self._entries[name] = Entry(name, origin=origin or target.split(":")[0], target=target)

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    # -- look-up ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every registered name, built-in and plug-in, sorted."""
        self._load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> T:
        self._load_plugins()
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownNameError(self.unknown_message(name))
        if entry.value is None:
            entry.value = self._import(entry)
        return entry.value

    def origin(self, name: str) -> str:
        self._load_plugins()
        return self._entries[name].origin

    def unknown_message(self, name: str, extra_names: list[str] | None = None) -> str:
        known = sorted({*self.names(), *(extra_names or [])})
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(known)}"

    # -- internals -------------------------------------------------------------------------
    def _check_type(self, name: str, obj: object) -> None:
        if not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise TypeError(f"{self.kind} {name!r} must be a {self.base.__name__} subclass, got {obj!r}")

    def _import(self, entry: Entry[T]) -> T:
        module_name, _, attribute = (entry.target or "").partition(":")
        obj = getattr(importlib.import_module(module_name), attribute)
        self._check_type(entry.name, obj)
        if self.on_register:
            self.on_register(entry.name, obj)
        return obj

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for point in entry_points(group=self.entry_point_group):
            self._add_plugin(point)

    def _add_plugin(self, point: EntryPoint) -> None:
        dist = getattr(point, "dist", None)
        where = f"plug-in {dist.name} {dist.version} ({point.value})" if dist else f"plug-in {point.value}"
        existing = self._entries.get(point.name)
        if existing is not None and not existing.plugin:
            warnings.warn(
                f"{where} registers the {self.kind} {point.name!r}, which is a built-in name "
                f"({existing.origin}); the plug-in is ignored. Rename it in its entry points.",
                PluginWarning,
                stacklevel=3,
            )
            return
        try:
            loaded = point.load()
            if isinstance(loaded, type) and issubclass(loaded, self.base):
                obj = loaded
            else:  # a module whose import registered the entry itself
                obj = self._entries[point.name].value if point.name in self._entries else None
                if obj is None:
                    raise TypeError(f"it names {loaded!r}, which is not a {self.base.__name__} subclass")
            self._check_type(point.name, obj)
        except Exception as err:  # a broken plug-in must not break unrelated commands
            self.broken_plugins[point.name] = f"{type(err).__name__}: {err}"
            warnings.warn(
                f"{where}: the {self.kind} {point.name!r} could not be loaded and is left out "
                f"({type(err).__name__}: {err})",
                PluginWarning,
                stacklevel=3,
            )
            return
        self._entries[point.name] = Entry(point.name, origin=where, value=obj, plugin=True)
        if self.on_register:
            self.on_register(point.name, obj)
