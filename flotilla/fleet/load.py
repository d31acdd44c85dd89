"""The fleet file: YAML to the fleet model, every value checked on load.

An error names the field by its path in the file (`engines[1].replicas`) and, read from a file,
the file (`fleet.yaml: engines[1].replicas=5: must lie within min=1 and max=2`); a YAML syntax
error names `fleet.yaml:LINE:COLUMN`. See docs/fleet-file.md.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flotilla.errors import ConfigError
from flotilla.fleet.model import (
    DEFAULT_POLICY,
    AutoscalerSection,
    DemoSection,
    EngineGroup,
    Fleet,
    file_key,
)
from loadgen.results import Slo
from proxy.config import load_yaml, proxy_section, read_config_file

DEFAULT_FLEET = "fleet.default.yaml"
"""Packaged in `proxy/`; the fleet `flotilla up` starts when given no file."""
SECTIONS = ("engines", "proxy", "autoscaler", "slo", "demo")
PROXY_KEYS = ("port", "policy", "backends", "scrape_interval_s")

_RENAMES = {"min": "min_replicas", "max": "max_replicas"}
"""File key -> EngineGroup field, where they differ."""
_NULLABLE = frozenset({"parallel", "ctx_size", "gpu_layers", "trace", "max_requests", "weight"})
"""Keys whose default is None, so `key: null` (or `key:`) is the default; for others it is an error."""
_ENGINE_KINDS: dict[str, type] = {
    "flavor": str, "model": str, "gpu": str, "name": str, "quant": str, "tensor_parallel": int,
    "pipeline_parallel": int, "gpu_layers": int, "parallel": int, "ctx_size": int, "replicas": int,
    "min_replicas": int, "max_replicas": int, "time_scale": float, "load_gbps": float, "weight": float,
    "role": str}


def parse_fleet_file(text: str, base: Path = Path("."), source: str | None = None) -> Fleet:
    """A fleet file's text to a validated Fleet; relative paths resolve against `base`. Errors
    name the field by its path in the file and, given `source`, the file (YAML syntax errors:
    file:line:column)."""
    data = load_yaml(text, source or "<fleet file>") or {}
    try:
        return fleet_from_mapping(data, base)
    except ConfigError as exc:
        raise (exc.located(source) if source else exc) from None


def load_fleet_file(path: Path | str | None = None) -> Fleet:
    """Read a fleet file, or the packaged default when `path` is None."""
    if path is None:
        return parse_fleet_file(default_fleet_path().read_text())
    return parse_fleet_file(read_config_file(Path(path)), Path(path).resolve().parent, str(path))


def default_fleet_path() -> Path:
    """proxy/fleet.default.yaml, where the package is installed."""
    return Path(str(importlib.resources.files("proxy") / DEFAULT_FLEET))


def fleet_from_mapping(data: object, base: Path = Path(".")) -> Fleet:
    """A parsed fleet file (a mapping of sections) to a validated Fleet."""
    if not isinstance(data, dict):
        raise ConfigError("fleet", type(data).__name__, "must be a mapping")
    for key in data:
        if key not in SECTIONS:
            raise ConfigError(str(key), data[key], f"unknown section ({', '.join(SECTIONS)})")
    items = data.get("engines")
    if not isinstance(items, list) or not items:
        raise ConfigError("engines", items, "must be a non-empty list of engine groups")
    engines = tuple(_engine(item, i) for i, item in enumerate(items))
    _unique_names(engines)
    fleet = Fleet(engines=engines, **_proxy(data.get("proxy")),
                  autoscaler=_autoscaler(data["autoscaler"]) if data.get("autoscaler") else None,
                  slo=_slo(data.get("slo")), demo=_demo(data.get("demo"), base))
    _check_scaled_group(fleet)
    return fleet


def _fields(known: set[str], data: object, where: str) -> dict[str, object]:
    """A mapping's keys as dataclass fields; an unknown key is an error naming it."""
    if not isinstance(data, dict):
        raise ConfigError(where, data, "must be a mapping")
    out = {}
    for key, value in data.items():
        attr = _RENAMES.get(str(key), str(key).replace("-", "_"))
        if attr not in known:
            raise ConfigError(f"{where}.{key}", value, "unknown key")
        out[attr] = value
    return out


def _typed(where: str, key: str, value: object, kind: type) -> Any:
    if value is None and key in _NULLABLE:
        return None
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigError(f"{where}.{file_key(key)}", value, "must be a finite number")
        return float(value)
    if kind is str and isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"{where}.{file_key(key)}", value, f"must be {kind.__name__}")
    return value


def _engine(data: object, index: int) -> EngineGroup:
    where = f"engines[{index}]"
    raw = _fields({f.name for f in dataclasses.fields(EngineGroup)}, data, where)
    for key in ("flavor", "model"):
        if key not in raw:
            raise ConfigError(f"{where}.{key}", None, "is required")
    kw = {k: _typed(where, k, v, _ENGINE_KINDS[k]) for k, v in raw.items() if k != "args"}
    args = raw.get("args") or ()
    if not isinstance(args, list | tuple) or not all(isinstance(a, str | int | float) for a in args):
        raise ConfigError(f"{where}.args", args, "must be a list of flags")
    replicas = kw.get("replicas", 1)
    kw.setdefault("min_replicas", min(1, replicas) if isinstance(replicas, int) else 1)
    kw.setdefault("max_replicas", replicas)
    kw.setdefault("name", f"{kw['flavor']}-{index}")
    group = EngineGroup(args=tuple(str(a) for a in args), **kw)
    group.check(where)
    return group


def _proxy(section: object) -> dict[str, Any]:
    """The `proxy:` section as Fleet fields: backends and policy read by the proxy's own parser
    (proxy.config.proxy_section), the policy looked up in the registry, port and scrape interval."""
    section = section or {}
    raw = _fields(set(PROXY_KEYS), section, "proxy")
    port = raw.get("port", 8000)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError("proxy.port", port, "must be an integer in [0, 65535]")
    routing = proxy_section(raw, "proxy.")
    _check_routing_policy(routing.policy)
    scrape = _typed("proxy", "scrape_interval_s", raw.get("scrape_interval_s", 1.0), float)
    if "scrape_interval_s" in raw and not scrape > 0:
        raise ConfigError("proxy.scrape_interval_s", scrape, "must be > 0")
    return {"port": port, "policy": routing.policy or DEFAULT_POLICY, "backends": routing.backends,
            "scrape_interval_s": scrape if "scrape_interval_s" in raw else None}


def _check_routing_policy(spec: str | None) -> None:
    from policies.routing.registry import create_policy

    try:
        create_policy(spec or DEFAULT_POLICY)
    except ValueError as exc:  # an unknown name, key or value, each named by the registry
        raise ConfigError("proxy.policy", spec, str(exc)) from None


def _autoscaler(data: object) -> AutoscalerSection:
    if not isinstance(data, dict):
        raise ConfigError("autoscaler", data, "must be a mapping")
    settings = dict(data)
    engines = settings.pop("engines", "")
    signals = settings.pop("signals", AutoscalerSection.signals)
    if not isinstance(engines, str):
        raise ConfigError("autoscaler.engines", engines, "must name an engine group")
    if not isinstance(signals, list | tuple) or not all(isinstance(x, str) for x in signals):
        raise ConfigError("autoscaler.signals", signals, "must be a list of signal names")
    if not isinstance(settings.get("policy") or "", str):
        raise ConfigError("autoscaler.policy", settings["policy"], "must be a policy spec NAME[:key=value,...]")
    return AutoscalerSection(engines=engines, signals=tuple(signals), settings=settings)


def _slo(data: object) -> Slo | None:
    """`slo: {ttft_s: 0.5, tpot_s: 0.05, e2e_s: 10}`, modelled seconds, each optional."""
    if data is None:
        return None
    raw = _fields({"ttft_s", "tpot_s", "e2e_s"}, data, "slo")
    for key, value in raw.items():
        if not _typed("slo", key, value, float) > 0:
            raise ConfigError(f"slo.{key}", value, "must be > 0 seconds")
    return Slo(**{k: float(v) for k, v in raw.items()})  # type: ignore[arg-type]  # values checked above


def _section(cls: type, data: object, where: str, kinds: Mapping[str, type]) -> Any:
    raw = _fields({f.name for f in dataclasses.fields(cls)}, data or {}, where)
    section = cls(**{k: _typed(where, k, v, kinds.get(k, object)) for k, v in raw.items()})
    section.check(where)
    return section


def _demo(data: object, base: Path) -> DemoSection:
    demo: DemoSection = _section(DemoSection, data, "demo", {"trace": str, "speedup": float, "max_requests": int})
    if demo.trace is not None:
        trace = Path(demo.trace)
        return DemoSection(trace=trace if trace.is_absolute() else base / trace, speedup=demo.speedup,
                           max_requests=demo.max_requests)
    return demo


def _unique_names(engines: tuple[EngineGroup, ...]) -> None:
    seen: set[str] = set()
    for i, group in enumerate(engines):
        if group.name == "proxy" or "/" in group.name:
            raise ConfigError(f"engines[{i}].name", group.name, "is reserved or not a plain name")
        if group.name in seen:
            raise ConfigError(f"engines[{i}].name", group.name, "is used by another group")
        seen.add(group.name)


def _check_scaled_group(fleet: Fleet) -> None:
    if fleet.autoscaler is None:
        return
    if fleet.autoscaler.engines and fleet.autoscaler.engines not in {g.name for g in fleet.engines}:
        raise ConfigError("autoscaler.engines", fleet.autoscaler.engines, "names no engine group")
    group = fleet.scaled_group()
    assert group is not None  # a prefill group's autoscaler scales the proxy's prefill pool (role: prefill)
    fleet.autoscaler.check(group)

