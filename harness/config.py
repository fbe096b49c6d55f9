"""Configuration: YAML files plus ``key.path=value`` overrides, into typed, frozen dataclasses.

Loading has no side effects (no environment variables, no seeding, no folders): it only reads
and validates. Unknown keys are errors with a did-you-mean hint, naming the full key path.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from harness.registry import Registry, resolve

T = TypeVar("T")

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class ConfigError(ValueError):
    """A configuration problem; the message names the key path (and file) at fault."""


# Bounds on what one YAML document may hold, checked as it is read (before anything is built or
# run): values once its aliases are expanded (a tree of aliases of aliases, an "alias bomb", grows
# exponentially: a few hundred bytes expand to gigabytes in the first walk over it), and depth.
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 100


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice (the safe loader keeps the
    last silently, so a recipe's second ``trainer.out`` or ``lr`` would win unseen). A merge
    (``<<: *base``) may still be overridden: only keys written out count."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                line = first.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: the safe loader's own error follows
                continue
            if line != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line {line})", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, where: str) -> Any:
    """``text`` as YAML (safe loader), within :data:`MAX_YAML_VALUES` values once aliases are
    expanded and :data:`MAX_YAML_DEPTH` levels of nesting; anything else raises
    :class:`ConfigError` starting with ``where`` (the file, or the override), naming what is wrong
    (a key given twice in one mapping among it, with its lines).
    Every YAML harness reads from a user goes through here (:func:`read_yaml`)."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except RecursionError:  # PyYAML's parser recurses once per level of nesting
        raise ConfigError(f"{where} nests deeper than {MAX_YAML_DEPTH} levels") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {e}") from None
    _check_expanded(data, where)
    return data


def _check_expanded(data: Any, where: str) -> None:
    """Count the values of ``data`` as a walk over it would meet them (a value an alias refers to
    from k places counts k times) and its depth, each distinct container walked once (memoised by
    identity, so an alias bomb is measured without being expanded)."""
    seen: dict[int, tuple[int, int]] = {}  # id -> (values, levels) below and including it

    def measure(node: Any, depth: int) -> tuple[int, int]:
        if not isinstance(node, dict | list):
            return 1, 0
        if depth > MAX_YAML_DEPTH:  # a document that refers to itself nests without end
            raise ConfigError(f"{where} nests deeper than {MAX_YAML_DEPTH} levels (or an alias refers to itself)")
        if id(node) not in seen:
            total, height = 1, 0
            for child in [*node.keys(), *node.values()] if isinstance(node, dict) else node:
                n, h = measure(child, depth + 1)
                total, height = total + n, max(height, h + 1)
                if total > MAX_YAML_VALUES:
                    raise ConfigError(
                        f"{where}: its aliases (*name) expand to more than {MAX_YAML_VALUES:,} values; refused "
                        "before anything was built (an alias bomb?). Write the values out, or use fewer aliases"
                    )
            seen[id(node)] = (total, height)
        total, height = seen[id(node)]
        if depth + height > MAX_YAML_DEPTH:
            raise ConfigError(f"{where} nests deeper than {MAX_YAML_DEPTH} levels")
        return total, height

    measure(data, 0)


def read_yaml(path: str | Path) -> Any:
    """The YAML document in the file ``path`` (see :func:`parse_yaml`); a missing, unreadable or
    non-UTF-8 file is a :class:`ConfigError` naming it."""
    path = Path(path)
    if path.is_dir() or not path.exists():  # a pipe (-c <(...)) or a device is read as a file
        raise ConfigError(f"config file {path} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {e.start}: {raw[e.start : e.start + 1]!r}); save it as UTF-8"
        ) from None
    return parse_yaml(text, f"config file {path}")


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into a nested dict; values are parsed as YAML scalars/lists."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key.path=value")
        value = parse_yaml(raw, f"override {item!r}: value") if raw != "" else ""
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            value = float(value)
        set_path(out, key.strip(), value)
    return out


def section(data: dict[str, Any], key: str, what: str = "") -> dict[str, Any]:
    """``data[key]`` when it is a mapping ({} when absent or null): what code reading a raw
    config before :func:`from_dict` checks it needs; anything else raises :class:`ConfigError`
    naming the key (``what``: what the section holds, for the message)."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        hint = f" ({what})" if what else ""
        raise ConfigError(f"{key} must be a mapping{hint}, not {type(value).__name__} {value!r:.60}")
    return value


def set_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {dotted!r}: {p!r} is not a section")
        cur = nxt
    cur[parts[-1]] = value


def pop_paths(d: dict[str, Any], dotted: Iterable[str]) -> dict[str, Any]:
    """Remove each dotted key present in the nested dict ``d`` (in place); returns the removed
    values by dotted key. A key whose sections are missing is skipped."""
    popped: dict[str, Any] = {}
    for key in dotted:
        *parents, leaf = key.split(".")
        node: Any = d
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict) and leaf in node:
            popped[key] = node.pop(leaf)
    return popped


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A new dict: ``extra`` wins; nested dicts merge key by key."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A config file: a mapping (see :func:`read_yaml`; an empty file is ``{}``)."""
    path = Path(path)
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, not {type(data).__name__}")
    return data


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: cannot be {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(repr(a) for a in args)}")
        return value
    if _is_dataclass_type(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a section (mapping), got {value!r}")
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        if args and args[0] is str and (odd := [k for k in value if not isinstance(k, str)]):
            raise ConfigError(not_a_string_key(odd[0], where))  # env: {on: 1} names no variable
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            # YAML 1.1 reads "1e-6" (no dot) as a string; learning rates are written like that.
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):  # .nan passes every range check, .inf overflows a timeout: neither is a setting
            raise ConfigError(f"{where}: expected a finite number, got {value}")
        return float(value)
    if tp is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def not_a_string_key(key: Any, where: str) -> str:
    """The message for a key YAML did not read as text: ``on``, ``off``, ``yes`` and ``no`` are
    booleans to it, ``~`` null and ``1`` a number, so such a key matches no option."""
    shown = "null" if key is None else str(key).lower() if isinstance(key, bool) else repr(key)
    what = "null" if key is None else "a boolean" if isinstance(key, bool) else "a number"
    return (
        f"unknown config key {shown} {'in ' + repr(where) if where else 'at the top level'}: YAML reads this key "
        f"as {what}, not a name (on, off, yes and no are booleans to it, ~ is null); no option is called that. "
        'Quote it ("on": ...) if you meant the word'
    )


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build the frozen dataclass ``cls`` from ``data``, checking every key and type. A key in
    ``cls.MOVED_KEYS`` (a class variable, key → the key to use) is refused, naming its successor."""
    hints = typing.get_type_hints(cls)
    fields = {config_key(f): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    moved: dict[str, str] = getattr(cls, "MOVED_KEYS", {})  # key → the key that owns it now
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(not_a_string_key(key, where))
        path = f"{where}.{key}" if where else key
        if key in moved:
            raise ConfigError(f"{path!r} is not read here (it would be overridden): set {moved[key]!r} instead")
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {(where + '.' if where else '') + close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {path!r}{hint}")
        kwargs[fields[key].name] = _coerce(value, hints[fields[key].name], path)
    for name, f in fields.items():
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required config key {(where + '.' if where else '') + name!r}")
    try:
        return cls(**kwargs)
    except ValueError as e:  # a range check in __post_init__: name where it came from (once)
        said = str(e)
        raise ConfigError(f"{where}.{said}" if where and not said.startswith(f"{where}.") else said) from None


def require_at_least(obj: Any, minimum: float, *names: str) -> None:
    """Range checks for ``__post_init__``: each named field is ``None`` or at least ``minimum``.

    Raises ``ValueError("<field> must be at least <minimum>, got <value>")``; :func:`from_dict`
    prefixes the config path (``agent.max_turns must be ...``).
    """
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < minimum:
            raise ValueError(f"{name} must be at least {minimum}, got {value}")


def require_between(obj: Any, lo: float, hi: float, *names: str) -> None:
    """Range checks for ``__post_init__``: each named field is ``None`` or in ``[lo, hi]``.
    Raises ``ValueError("<field> must be in [lo, hi], got <value>")``."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and not lo <= value <= hi:
            raise ValueError(f"{name} must be in [{lo:g}, {hi:g}], got {value}")


def require_positive(obj: Any, *names: str) -> None:
    """Range checks for ``__post_init__``: each named field is ``None`` or greater than 0 (a
    timeout of 0 or less would fail every call). Raises ``ValueError("<field> must be greater
    than 0, got <value>")``."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be greater than 0, got {value}")


def require_registered(obj: Any, **registries: str) -> None:
    """Name checks for ``__post_init__``: each named field's value is a name in the registry that
    its ``"package.module:REGISTRY"`` target names, so the registry is the one list of what exists
    (no ``Literal`` repeats it). Raises ``ValueError("<field>: <value> is not a registered <kind>;
    one of <names>")`` with a did-you-mean hint. The registry's module is imported here, on first
    use: a config module need not import the implementations (which import torch, or the config)."""
    for name, target in registries.items():
        registry = resolve(target)
        if not isinstance(registry, Registry):
            raise TypeError(f"{target!r} names a {type(registry).__name__}, not a Registry")
        value = getattr(obj, name)
        if value in registry:
            continue
        close = difflib.get_close_matches(str(value), registry.names(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"{name}: {value!r} is not a registered {registry.kind}; one of {', '.join(registry.names())}{hint}"
        )


def config_key(f: dataclasses.Field) -> str:
    """A field's key in YAML: its name, or ``metadata["key"]`` where the key is a Python keyword
    (``trainer.async`` is the field ``async_``)."""
    return f.metadata.get("key", f.name)


def to_dict(obj: Any) -> Any:
    """The plain-data form of a config (for manifests and hashing), keyed as the YAML is."""
    if dataclasses.is_dataclass(obj):
        return {config_key(f): to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def compose(
    cls: type[T], files: Iterable[str | Path] = (), overrides: Iterable[str] = (), base: dict | None = None
) -> T:
    """``base`` <- each YAML file in order <- ``key=value`` overrides, validated into ``cls``."""
    data: dict[str, Any] = dict(base or {})
    for f in files:
        try:
            data = deep_merge(data, load_yaml(f))
        except ConfigError:
            raise
    data = deep_merge(data, parse_overrides(overrides))
    return from_dict(cls, data)
