"""One registry per kind of policy (routing, scaling), and the `NAME[:key=value,...]` spec language.

`policies.routing.registry` and `policies.scaling.registry` are thin instances of
`PolicyRegistry`, so both kinds find, name, parse and refuse policies the same way:

- Built-ins are the modules of the kind's package; each registers its class with
  `@register_policy(name, config=ConfigDataclass)`. They are imported on the first lookup.
- Plug-ins are entry points of the kind's group (`flotilla.routing_policies`,
  `flotilla.scaling_policies`), listed without import and imported when first named.
- A name is one policy. Registering a second class under a taken name raises `ValueError`; an
  entry point that reuses a built-in name, or two entry points of one name, make that name a
  `ConfigError` naming both, never a silent choice: the operator must not run a policy other
  than the one they think they run.
- A spec's values are converted to the type of the config field they set (bool, int, float,
  str, unions of these with `None`), and every bad spec is a `ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import pkgutil
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from flotilla.errors import ConfigError

__all__ = ["ConfigError", "EmptyConfig", "PolicyEntry", "PolicyRegistry", "UnknownPolicyError",
           "convert", "parse_spec"]

_NONE_WORDS = ("none", "null", "")
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")


class UnknownPolicyError(ValueError):
    """A policy name that is neither built in nor provided by an installed plug-in."""

    def __init__(self, kind: str, name: str, valid: list[str]) -> None:
        super().__init__(f"unknown {kind} policy {name!r}; valid policies: {', '.join(valid)}")
        self.kind = kind
        self.name = name
        self.valid = valid


@dataclass(frozen=True)
class EmptyConfig:
    """For policies that take no parameters."""


class _Policy(typing.Protocol):
    """What the registry needs of a policy class: it sets these two on registration."""

    name: typing.ClassVar[str]
    Config: typing.ClassVar[type | None]


P = TypeVar("P", bound=_Policy)


@dataclass(frozen=True)
class PolicyEntry(Generic[P]):
    """One registered policy."""

    name: str
    """The name used in specs, e.g. `session-affinity`."""
    cls: type[P]
    """The policy class."""
    config: type
    """Dataclass of the policy's parameters, every field with a default (`EmptyConfig` if none)."""
    summary: str
    """First line of the class docstring."""
    plugin: str | None = None
    """The entry point's `module:attr` for a plug-in; None for a built-in."""


class PolicyRegistry(Generic[P]):
    """The policies of one kind: `kind` names it in messages, `base` is the class every policy of
    the kind subclasses, `package` holds the built-ins and `group` is the plug-ins' entry points."""

    def __init__(self, kind: str, base: type, package: str, group: str) -> None:
        self.kind = kind
        self.base = base
        self.package = package
        self.group = group
        self._entries: dict[str, PolicyEntry[P]] = {}
        self._builtins_loaded = False

    def register(self, name: str, config: type | None = None) -> Callable[[type[P]], type[P]]:
        """Class decorator: register a policy under `name` with its config dataclass (default: the
        class's own `Config`, else `EmptyConfig`)."""

        def wrap(cls: type[P]) -> type[P]:
            self._add(name, cls, config)
            return cls

        return wrap

    def _add(self, name: str, cls: type[P], config: type | None, plugin: str | None = None) -> PolicyEntry[P]:
        known = self._entries.get(name)
        if known is not None and known.cls is not cls:
            raise ValueError(f"{self.kind} policy {name!r} is already registered by {known.cls.__qualname__}")
        cfg = config or cls.Config or EmptyConfig
        if not dataclasses.is_dataclass(cfg):
            raise TypeError(f"config of {self.kind} policy {name!r} must be a dataclass")
        cls.name = name
        cls.Config = cfg
        doc = (cls.__doc__ or "").strip()
        entry = PolicyEntry(name, cls, cfg, doc.splitlines()[0] if doc else "", plugin)
        self._entries[name] = entry
        return entry

    def forget(self, name: str) -> None:
        """Drop a registration (tests that install a plug-in for a while)."""
        self._entries.pop(name, None)

    def _load_builtins(self) -> None:
        if not self._builtins_loaded:
            self._builtins_loaded = True
            package = importlib.import_module(self.package)
            for module in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self.package}.{module.name}")

    def _entry_points(self) -> list[importlib.metadata.EntryPoint]:
        return list(importlib.metadata.entry_points(group=self.group))

    def available(self) -> list[str]:
        """Every policy name: built-ins and installed plug-ins (plug-ins are listed, not imported)."""
        self._load_builtins()
        return sorted(set(self._entries) | {ep.name for ep in self._entry_points()})

    def entry(self, name: str) -> PolicyEntry[P]:
        """The registration of `name`, importing its plug-in on first use."""
        self._load_builtins()
        claims = [ep for ep in self._entry_points() if ep.name == name]
        known = self._entries.get(name)
        if known is not None and known.plugin is None and claims:
            raise self._conflict(name, f"the built-in {known.cls.__module__}.{known.cls.__qualname__}", claims[0])
        if len(claims) > 1:
            raise self._conflict(name, _plugin(claims[0]), claims[1])
        if known is not None:
            return known
        if claims:
            return self._load_plugin(claims[0])
        raise UnknownPolicyError(self.kind, name, self.available())

    def _conflict(self, name: str, first: str, other: importlib.metadata.EntryPoint) -> ConfigError:
        return ConfigError("policy", name, f"claimed by both {first} and {_plugin(other)}; "
                                           f"uninstall one or rename the plug-in's entry point")

    def _load_plugin(self, ep: importlib.metadata.EntryPoint) -> PolicyEntry[P]:
        obj = ep.load()
        if not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise TypeError(f"entry point {ep.name!r} ({ep.value}) is not a {self.base.__name__} subclass")
        return self._add(ep.name, cast("type[P]", obj), None, plugin=ep.value)  # a subclass of base

    def parse(self, spec: str, extra: type | None = None) -> tuple[PolicyEntry[P], dict[str, Any]]:
        """The entry `spec` names and its settings converted to their fields' types. A key sets a
        field of the policy's config, else one of the `extra` dataclass (e.g. shared limits)."""
        name, raw = parse_spec(spec)
        entry = self.entry(name)
        config_fields = field_types(entry.config)
        extra_fields = field_types(extra) if extra is not None else {}
        settings: dict[str, Any] = {}
        for key, text in raw.items():
            hint = config_fields.get(key, extra_fields.get(key))
            if key not in config_fields and key not in extra_fields:
                known = ", ".join(sorted(config_fields) + sorted(extra_fields))
                raise ConfigError(key, text, f"unknown parameter of {name}; known: {known}")
            settings[key] = convert(key, text, hint)
        return entry, settings


def _plugin(ep: importlib.metadata.EntryPoint) -> str:
    dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
    return f"the plug-in entry point '{ep.name} = {ep.value}' of {dist}"


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split `NAME[:key=value,...]` into the name and its raw settings (keys with dashes read
    as underscores, values stripped); a key given twice or without `=` is a ConfigError."""
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name:
        raise ConfigError("policy", spec, "empty policy name")
    settings: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(key or "spec", item, "expected key=value")
        if key in settings:
            raise ConfigError(key, value.strip(), "given twice")
        settings[key] = value.strip()
    return name, settings


def field_types(cls: type) -> dict[str, Any]:
    """The init fields of a config dataclass and their resolved type hints."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def convert(field: str, raw: str, hint: Any) -> object:
    """The text of a setting as the field's type: bool, int, float or str, or a union of these
    (members tried in order) with None (`none`, `null` or empty)."""
    members = typing.get_args(hint) if _is_union(hint) else (hint,)
    if type(None) in members and raw.lower() in _NONE_WORDS:
        return None
    kinds = [m for m in members if m is not type(None)]
    if not any(kind in _PARSERS for kind in kinds):
        raise ConfigError(field, raw, f"settings of type {hint} cannot be given in a spec")
    for kind in kinds:
        parser = _PARSERS.get(kind)
        if parser is None:
            continue
        try:
            return parser(raw)
        except ValueError:
            continue
    names = "/".join(getattr(m, "__name__", str(m)) for m in members)
    raise ConfigError(field, raw, f"expected {names}")


def _is_union(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union


def _parse_bool(raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE_WORDS:
        return True
    if low in _FALSE_WORDS:
        return False
    raise ValueError(raw)


_PARSERS: Mapping[object, Callable[[str], object]] = {bool: _parse_bool, int: int, float: float, str: str}
