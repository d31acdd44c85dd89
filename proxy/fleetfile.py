"""The fleet file of `flotilla up`: engines, proxy, autoscaler and demo sections.

The proxy section is the one `flotilla proxy --config` reads (proxy/config.py); this module adds
what a local fleet needs around it. Every value is checked on load and an error names the field
by its path in the file, e.g. ``engines[1].replicas``. See docs/fleet-file.md.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath

import yaml

from proxy.config import ConfigError, load_yaml, parse_fleet, read_config_file

ENGINE_FLAVORS = ("vllm", "llamacpp")
ACTUATORS = ("local",)
DEFAULT_FLEET = "fleet.default.yaml"
"""Packaged next to this module; used when `flotilla up` is given no file."""


@dataclass(frozen=True)
class EngineGroup:
    """Identical look-alike engine replicas of one model on one kind of GPU."""

    flavor: str
    """vllm (fake-vllm serve) or llamacpp (fake-llama-server)."""
    model: str
    """Catalogue model name, e.g. llama-3.1-8b; also the name clients ask for."""
    gpu: str = "h100"
    """Catalogue GPU name."""
    name: str = ""
    """Label of the group in logs and the status table; default flavor-index."""
    quant: str = "Q4_K_M"
    """llama.cpp only: the GGUF quantisation (the file is llama-3.1-8b-Q4_K_M.gguf)."""
    tensor_parallel: int = 1
    """vLLM -tp: GPUs per pipeline stage."""
    pipeline_parallel: int = 1
    """vLLM -pp: pipeline stages."""
    gpu_layers: int = 99
    """llama.cpp -ngl: layers offloaded to the GPU."""
    parallel: int | None = None
    """llama.cpp -np: slots (None: the server's default)."""
    ctx_size: int = 32768
    """llama.cpp -c: context tokens shared by all slots (each slot gets ctx_size / parallel)."""
    args: tuple[str, ...] = ()
    """Extra flags appended to every replica's command line."""
    replicas: int = 1
    """Replicas started by `flotilla up`."""
    min_replicas: int = 1
    """Floor the autoscaler keeps (file key `min`)."""
    max_replicas: int = 1
    """Ceiling the autoscaler may reach (file key `max`)."""
    time_scale: float = 1.0
    """Modelled seconds run in time_scale real seconds (0.05: 20x faster); cold starts too."""
    load_gbps: float = 5.0
    """Weight loading bandwidth in GB/s; with time_scale it sets how fast a replica starts."""
    weight: float | None = None
    """Capacity of one replica for routing (`BackendSpec.weight`); None: its modelled requests
    per second when full (`capacity_weight`)."""

    def check(self, where: str) -> None:
        if self.flavor not in ENGINE_FLAVORS:
            raise ConfigError(f"{where}.flavor", self.flavor, f"must be one of {', '.join(ENGINE_FLAVORS)}")
        if not self.model:
            raise ConfigError(f"{where}.model", self.model, "must name a catalogue model")
        for key in ("tensor_parallel", "pipeline_parallel", "ctx_size", "replicas", "max_replicas"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{where}.{_file_key(key)}", getattr(self, key), "must be >= 1")
        if self.min_replicas < 0:
            raise ConfigError(f"{where}.min", self.min_replicas, "must be >= 0")
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ConfigError(f"{where}.replicas", self.replicas,
                              f"must lie within min={self.min_replicas} and max={self.max_replicas}")
        if self.parallel is not None and self.parallel < 1:
            raise ConfigError(f"{where}.parallel", self.parallel, "must be >= 1")
        for key in ("time_scale", "load_gbps"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{where}.{key}", getattr(self, key), "must be > 0")
        if self.weight is not None and not self.weight > 0:
            raise ConfigError(f"{where}.weight", self.weight, "must be > 0")
        self._check_catalogue(where)

    def _check_catalogue(self, where: str) -> None:
        """The names the engines look up at start, looked up now, so none starts to fail."""
        from fake_engines.llamacpp.model import QUANT_BITS
        from fake_engines.perf.catalogue import load_catalogue

        catalogue = load_catalogue()
        if self.gpu.lower() not in catalogue.gpus:
            raise ConfigError(f"{where}.gpu", self.gpu, f"is not in the catalogue ({', '.join(sorted(catalogue.gpus))})")
        # fake-vllm also takes a path ending in a model name, or an explicit shape (--params ...)
        names = {self.model.lower(), PurePath(self.model).name.lower()} if self.flavor == "vllm" else {self.model.lower()}
        explicit = self.flavor == "vllm" and "--params" in self.args
        if not explicit and not names & set(catalogue.models):
            raise ConfigError(f"{where}.model", self.model,
                              f"is not in the catalogue ({', '.join(sorted(catalogue.models))})")
        if self.flavor == "llamacpp" and self.quant.upper() not in QUANT_BITS:
            raise ConfigError(f"{where}.quant", self.quant, f"must be one of {', '.join(QUANT_BITS)}")

    def capacity_weight(self) -> float:
        """`weight`, else what one replica can do as the capacity model has it: reference
        requests per second when full (fake_engines.capacity), so routing weighs an H100 vLLM
        replica about 17 times an RTX 4090 llama-server one. 1 when the engine cannot be sized."""
        return self.weight if self.weight is not None else _modelled_weight(tuple(self.command(port=0)))

    def command(self, port: int, seed: int = 0, host: str = "127.0.0.1") -> list[str]:
        """The look-alike engine's command line for one replica listening on `port`."""
        common = ["--gpu", self.gpu, "--host", host, "--port", str(port), "--time-scale", f"{self.time_scale:g}",
                  "--load-gbps", f"{self.load_gbps:g}", "--seed", str(seed)]
        if self.flavor == "vllm":
            return [sys.executable, "-m", "fake_engines.vllm.cli", "serve", self.model, *common,
                    "-tp", str(self.tensor_parallel), "-pp", str(self.pipeline_parallel), *self.args]
        slots = ["-np", str(self.parallel)] if self.parallel is not None else []
        return [sys.executable, "-m", "fake_engines.llamacpp.cli", "-m", f"{self.model}-{self.quant}.gguf",
                "-a", self.model, "-c", str(self.ctx_size), "-ngl", str(self.gpu_layers), *slots, "--metrics", *common, *self.args]


@dataclass(frozen=True)
class AutoscalerSection:
    """Scaling one engine group from inside the proxy (proxy/autoscale runs it)."""

    engines: str = ""
    """Name of the engine group it scales; default the first group whose min differs from max."""
    signals: tuple[str, ...] = ("waiting", "kv_cache_usage", "arrival_rate")
    """Signals shown to the policy, for the record; policies read the ones they need."""
    settings: Mapping[str, object] = field(default_factory=dict)
    """Every other key, as the proxy's `autoscaler:` section takes it (policy, interval_s, hold,
    ...); checked by proxy.autoscale.config."""

    def for_proxy(self, group: EngineGroup, log_dir: Path | None = None) -> dict[str, object]:
        """The proxy's `autoscaler:` section: these settings plus the group's command and limits.
        Its clock runs at the engines' time scale, so windows and cold starts stay in proportion."""
        section: dict[str, object] = {"actuator": "local", "time_scale": group.time_scale, **self.settings}
        section.update(engine_cmd=without_address(group.command(port=0)), flavor=group.flavor,
                       min=group.min_replicas, max=group.max_replicas, weight=group.capacity_weight())
        if log_dir is not None:
            section["engine_log_dir"] = str(log_dir)
        return section

    def check(self, group: EngineGroup) -> None:
        from proxy.autoscale.config import config_from_mapping

        if self.settings.get("actuator", "local") not in ACTUATORS:
            raise ConfigError("autoscaler.actuator", self.settings["actuator"],
                              f"flotilla up runs the {' or '.join(ACTUATORS)} actuator only")
        for key in ("engine_cmd", "flavor", "min", "max", "min_replicas", "max_replicas", "weight"):
            if key in self.settings:
                raise ConfigError(f"autoscaler.{key}", self.settings[key], "is set by the scaled engine group")
        from policies.scaling import create_policy

        try:
            create_policy(config_from_mapping(self.for_proxy(group)).policy)
        except ConfigError as exc:
            name = exc.field if exc.field.startswith("autoscaler.") else f"autoscaler.{exc.field}"
            raise ConfigError(name, exc.value, exc.reason) from None
        except ValueError as exc:  # an unknown policy name or a bad policy key
            raise ConfigError("autoscaler.policy", self.settings.get("policy"), str(exc)) from None


@functools.lru_cache(maxsize=64)
def _modelled_weight(command: tuple[str, ...]) -> float:
    from fake_engines.capacity import capacity_rps, engine_config

    try:
        return round(capacity_rps(engine_config(command)), 2) or 1.0
    except (ValueError, RuntimeError):  # the engine refuses these flags; it says why at start
        return 1.0


def without_address(argv: list[str]) -> list[str]:
    """An engine command minus --host/--port, which the actuator appends per replica."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in ("--host", "--port"):
            skip = True
        else:
            out.append(word)
    return out


@dataclass(frozen=True)
class DemoSection:
    """What `flotilla up --demo` replays."""

    trace: Path | None = None
    """Trace file (any loadgen format); None: the bundled demo slice."""
    speedup: float = 10.0
    """Trace time is divided by this."""
    max_requests: int | None = None
    """Send at most this many requests (None: the whole trace)."""

    def check(self, where: str) -> None:
        if not self.speedup > 0:
            raise ConfigError(f"{where}.speedup", self.speedup, "must be > 0")
        if self.max_requests is not None and self.max_requests < 1:
            raise ConfigError(f"{where}.max_requests", self.max_requests, "must be >= 1")

    def trace_path(self) -> Path:
        if self.trace is not None:
            return self.trace
        return Path(str(importlib.resources.files("loadgen") / "data" / "demo.jsonl"))


@dataclass(frozen=True)
class UpFleet:
    """A whole local fleet as `flotilla up` starts it."""

    engines: tuple[EngineGroup, ...]
    """Engine groups, at least one."""
    port: int = 8000
    """Port of the proxy on 127.0.0.1."""
    policy: str = "least-outstanding"
    """Routing policy spec NAME[:key=value,...] (docs/routing-policies.md)."""
    autoscaler: AutoscalerSection | None = None
    """None: every group keeps its `replicas`."""
    demo: DemoSection = field(default_factory=DemoSection)

    def scaled_group(self) -> EngineGroup | None:
        """The group the autoscaler owns, if any."""
        if self.autoscaler is None:
            return None
        if self.autoscaler.engines:
            return next(g for g in self.engines if g.name == self.autoscaler.engines)
        return next((g for g in self.engines if g.min_replicas != g.max_replicas), self.engines[0])


# file key -> dataclass field, where they differ
_RENAMES = {"min": "min_replicas", "max": "max_replicas"}


def _file_key(attr: str) -> str:
    return {v: k for k, v in _RENAMES.items()}.get(attr, attr)


def _fields(cls: type, data: object, where: str) -> dict[str, object]:
    """A mapping's keys as dataclass fields; an unknown key is an error naming it."""
    if not isinstance(data, dict):
        raise ConfigError(where, data, "must be a mapping")
    known = set(cls.__dataclass_fields__)
    out = {}
    for key, value in data.items():
        attr = _RENAMES.get(str(key), str(key).replace("-", "_"))
        if attr not in known:
            raise ConfigError(f"{where}.{key}", value, "unknown key")
        out[attr] = value
    return out


_NULLABLE = frozenset({"parallel", "trace", "max_requests", "weight"})
"""Keys whose default is None, so `key: null` (or `key:`) is the default; for others it is an error."""


def _typed(where: str, key: str, value: object, kind: type) -> object:
    if value is None and key in _NULLABLE:
        return None
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigError(f"{where}.{_file_key(key)}", value, "must be a finite number")
        return float(value)
    if kind is str and isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"{where}.{_file_key(key)}", value, f"must be {kind.__name__}")
    return value


_ENGINE_KINDS = {"flavor": str, "model": str, "gpu": str, "name": str, "quant": str, "tensor_parallel": int,
                 "pipeline_parallel": int, "gpu_layers": int, "parallel": int, "ctx_size": int, "replicas": int,
                 "min_replicas": int, "max_replicas": int, "time_scale": float, "load_gbps": float,
                 "weight": float}


def _engine(data: object, index: int) -> EngineGroup:
    where = f"engines[{index}]"
    raw = _fields(EngineGroup, data, where)
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


def _section(cls: type, data: object, where: str, kinds: dict[str, type]) -> object:
    raw = _fields(cls, data or {}, where)
    kw = {k: _typed(where, k, v, kinds.get(k, object)) for k, v in raw.items()}
    section = cls(**kw)
    section.check(where)
    return section


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


def _demo(data: object, base: Path) -> DemoSection:
    demo = _section(DemoSection, data, "demo", {"trace": str, "speedup": float, "max_requests": int})
    if demo.trace is not None:
        trace = Path(demo.trace)
        return DemoSection(trace=trace if trace.is_absolute() else base / trace, speedup=demo.speedup,
                           max_requests=demo.max_requests)
    return demo


def _proxy_port(section: object) -> int:
    port = section.get("port", 8000) if isinstance(section, dict) else 8000
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError("proxy.port", port, "must be an integer in [0, 65535]")
    return port


def parse_up_fleet(text: str, base: Path = Path("."), source: str | None = None) -> UpFleet:
    """A fleet file's text to a validated UpFleet; relative paths resolve against `base`.
    Errors name the field by its path in the file and, given `source`, the file (YAML syntax
    errors: file:line:column)."""
    data = load_yaml(text, source or "<fleet file>") or {}
    try:
        return _up_fleet(data, base)
    except ConfigError as exc:
        raise (exc.located(source) if source else exc) from None


def _up_fleet(data: object, base: Path) -> UpFleet:
    if not isinstance(data, dict):
        raise ConfigError("fleet", type(data).__name__, "must be a mapping")
    for key in data:
        if key not in ("engines", "proxy", "autoscaler", "demo"):
            raise ConfigError(str(key), data[key], "unknown section (engines, proxy, autoscaler, demo)")
    items = data.get("engines")
    if not isinstance(items, list) or not items:
        raise ConfigError("engines", items, "must be a non-empty list of engine groups")
    engines = tuple(_engine(item, i) for i, item in enumerate(items))
    _unique_names(engines)
    proxy = data.get("proxy") or {}
    if not isinstance(proxy, dict):
        raise ConfigError("proxy", proxy, "must be a mapping")
    policy = parse_fleet(yaml.safe_dump({"proxy": proxy})).policy if isinstance(proxy, dict) else None
    _check_routing_policy(policy)
    fleet = UpFleet(engines=engines, port=_proxy_port(proxy), policy=policy or "least-outstanding",
                    autoscaler=_autoscaler(data["autoscaler"]) if data.get("autoscaler") else None,
                    demo=_demo(data.get("demo"), base))
    _check_scaled_group(fleet)
    return fleet


def _check_routing_policy(spec: str | None) -> None:
    from policies.routing.registry import create_policy

    try:
        create_policy(spec or "least-outstanding")
    except ValueError as exc:  # an unknown name, key or value, each named by the registry
        raise ConfigError("proxy.policy", spec, str(exc)) from None


def _unique_names(engines: tuple[EngineGroup, ...]) -> None:
    seen: set[str] = set()
    for i, group in enumerate(engines):
        if group.name == "proxy" or "/" in group.name:
            raise ConfigError(f"engines[{i}].name", group.name, "is reserved or not a plain name")
        if group.name in seen:
            raise ConfigError(f"engines[{i}].name", group.name, "is used by another group")
        seen.add(group.name)


def _check_scaled_group(fleet: UpFleet) -> None:
    if fleet.autoscaler is None:
        return
    if fleet.autoscaler.engines and fleet.autoscaler.engines not in {g.name for g in fleet.engines}:
        raise ConfigError("autoscaler.engines", fleet.autoscaler.engines, "names no engine group")
    fleet.autoscaler.check(fleet.scaled_group())


def load_up_fleet(path: Path | None = None) -> UpFleet:
    """Read a fleet file, or the packaged default when `path` is None."""
    if path is None:
        text = (importlib.resources.files("proxy") / DEFAULT_FLEET).read_text()
        return parse_up_fleet(text)
    return parse_up_fleet(read_config_file(Path(path)), Path(path).resolve().parent, str(path))
