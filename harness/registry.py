"""One small generic registry per kind of extension (datasets, retrievers, backends, methods, ...).

Targets are registered lazily as ``"module:Object"`` strings so that listing what exists never
imports heavy optional dependencies; an unknown name gets a did-you-mean error.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate registry name. ``str()`` is the readable message."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


def resolve(target: str) -> Any:
    """The object a ``"package.module:Object"`` target names (its module imported on first use)."""
    module_name, sep, attr = target.partition(":")
    if not sep:
        raise ValueError(f"registry target {target!r} must look like 'package.module:Object'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Maps canonical snake_case names to objects, or to lazy ``"module:Object"`` targets."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T | str] = {}
        self._info: dict[str, dict[str, Any]] = {}

    def register(self, name: str, target: T | str | None = None, **info: Any) -> Callable[[T], T] | None:
        """Register ``target`` under ``name``; without a target, acts as a decorator."""
        if target is None:

            def deco(obj: T) -> T:
                self.register(name, obj, **info)
                return obj

            return deco  # type: ignore[return-value]
        if name in self._entries:
            raise RegistryError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = target
        self._info[name] = info
        return None

    def get(self, name: str) -> T:
        if name not in self._entries:
            close = difflib.get_close_matches(name, list(self._entries), n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise RegistryError(f"unknown {self.kind} {name!r}{hint} (known: {', '.join(sorted(self._entries))})")
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = resolve(entry)
            self._entries[name] = entry
        return entry  # type: ignore[return-value]

    def info(self, name: str) -> dict[str, Any]:
        if name not in self._info:
            raise RegistryError(f"unknown {self.kind} {name!r}")
        return self._info[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
