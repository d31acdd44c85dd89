"""The single source of routing-policy names, and the `NAME[:key=value,...]` spec language.

Built-in policies register themselves with `@register_policy`; third-party policies are found
through the entry-point group `flotilla.routing_policies` and imported only when asked for.
The CLI, the fleet file, the proxy and the simulator all go through `create_policy`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import random
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policies.routing.base import RoutingPolicy

ENTRY_POINT_GROUP = "flotilla.routing_policies"


class ConfigError(ValueError):
    """A policy parameter that is unknown, malformed or out of range."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(f"{field}={value!r}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason


class UnknownPolicyError(ValueError):
    """A policy name that is neither built in nor provided by an installed plug-in."""

    def __init__(self, name: str, valid: list[str]) -> None:
        super().__init__(f"unknown routing policy {name!r}; valid policies: {', '.join(valid)}")
        self.name = name
        self.valid = valid


@dataclass(frozen=True)
class EmptyConfig:
    """For policies that take no parameters."""


@dataclass(frozen=True)
class PolicySpec:
    """One registered policy."""

    name: str
    """The name used in specs, e.g. `session-affinity`."""
    cls: type[RoutingPolicy]
    """The policy class; instantiated as `cls(config, rng)`."""
    config: type
    """Dataclass of the policy's parameters, every field with a default."""


_REGISTRY: dict[str, PolicySpec] = {}

P = typing.TypeVar("P", bound=type[RoutingPolicy])


def register_policy(name: str, config: type | None = None) -> Callable[[P], P]:
    """Class decorator: register a policy under `name` with its config dataclass."""

    def wrap(cls: P) -> P:
        _register(name, cls, config)
        return cls

    return wrap


def _register(name: str, cls: type[RoutingPolicy], config: type | None) -> None:
    known = _REGISTRY.get(name)
    if known is not None and known.cls is not cls:
        raise ValueError(f"routing policy {name!r} is already registered by {known.cls.__qualname__}")
    cfg = config or cls.Config or EmptyConfig
    if not dataclasses.is_dataclass(cfg):
        raise TypeError(f"config of routing policy {name!r} must be a dataclass")
    cls.name = name
    cls.Config = cfg
    _REGISTRY[name] = PolicySpec(name=name, cls=cls, config=cfg)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def available_policies() -> list[str]:
    """Every policy name: built-ins and installed plug-ins (plug-ins are listed, not imported)."""
    return sorted(set(_REGISTRY) | {ep.name for ep in _entry_points()})


def policy_spec(name: str) -> PolicySpec:
    """The registration of `name`, importing its plug-in on first use."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    for ep in _entry_points():
        if ep.name == name:
            return _load_plugin(ep)
    raise UnknownPolicyError(name, available_policies())


def _load_plugin(ep: importlib.metadata.EntryPoint) -> PolicySpec:
    obj = ep.load()
    if ep.name not in _REGISTRY:
        if not (isinstance(obj, type) and issubclass(obj, RoutingPolicy)):
            raise TypeError(f"entry point {ep.name!r} ({ep.value}) is not a RoutingPolicy subclass")
        _register(ep.name, obj, None)
    return _REGISTRY[ep.name]


def parse_policy_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split `NAME[:key=value,...]` and convert each value to its config field's type."""
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name:
        raise ConfigError("policy", spec, "empty policy name")
    cfg = policy_spec(name).config
    hints = typing.get_type_hints(cfg)
    fields = {f.name for f in dataclasses.fields(cfg)}
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            raise ConfigError(key, None, "expected key=value")
        if key not in fields:
            raise ConfigError(key, raw, f"unknown parameter of {name}; known: {', '.join(sorted(fields))}")
        params[key] = _convert(key, raw.strip(), hints[key])
    return name, params


def make_config(name: str, params: dict[str, Any]) -> object:
    """Build the config dataclass of `name`; its `__post_init__` validates the values."""
    return policy_spec(name).config(**params)


def create_policy(spec: str, rng: random.Random | None = None) -> RoutingPolicy:
    """Build the policy that `spec` names, e.g. `session-affinity:home=modulo,bound=1.25`."""
    name, params = parse_policy_spec(spec)
    return policy_spec(name).cls(make_config(name, params), rng)


def _convert(field: str, raw: str, hint: Any) -> Any:
    options = _union_members(hint)
    if type(None) in options and raw.lower() in ("none", "null", ""):
        return None
    for kind in (o for o in options if o is not type(None)):
        try:
            return _to(kind, raw)
        except ValueError:
            continue
    names = "/".join(getattr(o, "__name__", str(o)) for o in options)
    raise ConfigError(field, raw, f"expected {names}")


def _union_members(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _to(kind: Any, raw: str) -> Any:
    if kind is bool:
        low = raw.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(raw)
    if kind in (int, float, str):
        return kind(raw)
    raise ValueError(f"unsupported parameter type {kind}")
