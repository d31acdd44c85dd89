"""The one list of scaling-policy names, and `NAME[:key=value,...]` specs turned into policies.

Built-in policies register themselves with `@register_policy`; plug-ins do the same from a
module named in the `flotilla.scaling_policies` entry-point group. The CLI choices, spec parsing
and listings all come from this registry. A spec's keys fill the policy's config dataclass or the
shared `ScalingLimits`, converted by the field's type, e.g. `kpa:target=4,min_replicas=0`.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from policies.scaling.base import ConfigError, ScalingLimits, ScalingPolicy

ENTRY_POINT_GROUP = "flotilla.scaling_policies"
# Modules of this package that hold no policy.
_NOT_POLICIES = frozenset({"base", "registry", "fluid", "observe"})


@dataclass(frozen=True)
class PolicyEntry:
    """One registered policy."""

    name: str
    cls: type[ScalingPolicy]
    config_cls: type | None
    summary: str
    """First line of the policy's docstring."""


_REGISTRY: dict[str, PolicyEntry] = {}
_loaded = False


def register_policy(name: str, config: type | None = None) -> Callable[[type[ScalingPolicy]], type[ScalingPolicy]]:
    """Class decorator: register a ScalingPolicy subclass under `name` with its config dataclass."""

    def wrap(cls: type[ScalingPolicy]) -> type[ScalingPolicy]:
        if name in _REGISTRY:
            raise ValueError(f"scaling policy {name!r} is already registered by {_REGISTRY[name].cls.__qualname__}")
        cls.name = name
        cls.Config = config
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        _REGISTRY[name] = PolicyEntry(name, cls, config, summary)
        return cls

    return wrap


class UnknownPolicyError(ValueError):
    """A scaling-policy name that is neither built in nor provided by an installed plug-in."""

    def __init__(self, name: str, valid: list[str]) -> None:
        super().__init__(f"unknown scaling policy {name!r}; valid policies: {', '.join(valid)}")
        self.name = name
        self.valid = valid


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        package = importlib.import_module("policies.scaling")
        for module in pkgutil.iter_modules(package.__path__):
            if module.name not in _NOT_POLICIES:
                importlib.import_module(f"policies.scaling.{module.name}")


def _entry_points() -> list[EntryPoint]:
    return list(entry_points(group=ENTRY_POINT_GROUP))


def available_policies() -> list[str]:
    """Every policy name: built-ins and installed plug-ins (plug-ins are listed, not imported)."""
    _load_builtins()
    return sorted(set(_REGISTRY) | {ep.name for ep in _entry_points()})


def policy_entry(name: str) -> PolicyEntry:
    """The registration of `name`, importing its plug-in on first use."""
    _load_builtins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    for ep in _entry_points():
        if ep.name == name:
            return _load_plugin(ep)
    raise UnknownPolicyError(name, available_policies())


def _load_plugin(ep: EntryPoint) -> PolicyEntry:
    obj = ep.load()
    if ep.name not in _REGISTRY:
        if not (isinstance(obj, type) and issubclass(obj, ScalingPolicy)):
            raise TypeError(f"entry point {ep.name!r} ({ep.value}) is not a ScalingPolicy subclass")
        register_policy(ep.name, obj.Config)(obj)
    return _REGISTRY[ep.name]


def parse_policy_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split `NAME[:key=value,...]` into the name and its raw settings (dashes in keys read as
    underscores)."""
    name, _, rest = spec.strip().partition(":")
    if not name.strip():
        raise ConfigError("policy", spec, "empty policy name")
    settings: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(key or "spec", item, "expected key=value")
        if key in settings:
            raise ConfigError(key, value, "given twice")
        settings[key] = value.strip()
    return name.strip(), settings


def create_policy(spec: str, defaults: Mapping[str, object] | None = None) -> ScalingPolicy:
    """Build the policy a spec names, e.g. `kpa:target=4,min_replicas=0`. `defaults` supply
    config fields the spec does not set (only fields the config has); the spec's settings win."""
    name, settings = parse_policy_spec(spec)
    entry = policy_entry(name)
    config_fields = _fields(entry.config_cls) if entry.config_cls else {}
    limit_fields = _fields(ScalingLimits)
    config_kwargs = {k: v for k, v in (defaults or {}).items() if k in config_fields}
    limit_kwargs: dict[str, object] = {}
    for key, raw in settings.items():
        if key in config_fields:
            config_kwargs[key] = convert(key, raw, config_fields[key])
        elif key in limit_fields:
            limit_kwargs[key] = convert(key, raw, limit_fields[key])
        else:
            valid = ", ".join(sorted(config_fields) + sorted(limit_fields))
            raise ConfigError(key, raw, f"unknown parameter of {name}; known: {valid}")
    config = entry.config_cls(**config_kwargs) if entry.config_cls else None
    return entry.cls(config=config, limits=ScalingLimits(**limit_kwargs))


def _fields(cls: type) -> dict[str, object]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def convert(key: str, raw: str, hint: object) -> object:
    """Turn the text of a setting into the field's type (bool, int, float, str, or X | None)."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if raw.lower() in ("none", "null", "") and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
    try:
        if hint is bool:
            return _parse_bool(raw)
        if hint in (int, float, str):
            return hint(raw)
    except ValueError:
        raise ConfigError(key, raw, f"expected {hint.__name__}") from None
    raise ConfigError(key, raw, f"settings of type {hint} cannot be given in a spec")


def _parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "yes", "on", "1"):
        return True
    if lowered in ("false", "no", "off", "0"):
        return False
    raise ValueError(raw)
