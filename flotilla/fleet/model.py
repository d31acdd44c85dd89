"""The fleet model: engine groups with their engine flags and counts, the router and its policy,
the autoscaler and its limits, SLOs. One typed description; every field's default is here.

`flotilla up` starts it, `flotilla sim --fleet` simulates it, the pytest fixtures run it live or
simulated, `flotilla compose` / `flotilla k8s` write it out. Each replica's engine is what its
group's command line gives (fake_engines.factory), wherever it runs.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from flotilla.errors import ConfigError
from loadgen.results import Slo
from proxy.config import BackendSpec, KVEventsSource

if TYPE_CHECKING:
    from fake_engines.factory import EngineConfig
    from policies.scaling import ScalingPolicy

ENGINE_FLAVORS = ("vllm", "llamacpp")
ACTUATORS = ("local",)
DEFAULT_POLICY = "least-outstanding"
"""Routing policy of a fleet whose file names none (the proxy's own default)."""


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
    gpu_layers: int | None = None
    """llama.cpp -ngl: layers offloaded to the GPU (None: the server's default, all of them)."""
    parallel: int | None = None
    """llama.cpp -np: slots (None: the server's default, 4 sharing one pool)."""
    ctx_size: int | None = None
    """llama.cpp -c: context tokens shared by all slots, each slot getting ctx_size / parallel
    (None: the server's default, 4,096)."""
    args: tuple[str, ...] = ()
    """Extra flags appended to every replica's command line (later flags win, so `--seed 7` or
    `-c 8192` here override what the keys above set)."""
    replicas: int = 1
    """Replicas `flotilla up` starts."""
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
    role: str = ""
    """Disaggregated serving (docs/pd.md): "prefill" or "decode" vLLM replicas, started with
    the NixlConnector (`--kv-transfer-config`, kv_producer or kv_consumer, unless `args` give
    one) and routed as the proxy's prefill pool or its decode pool; "": colocated."""

    @property
    def served_model(self) -> str:
        """The model name clients send and the engines list on /v1/models."""
        return self.model

    def command(self, port: int, seed: int = 0, host: str = "127.0.0.1") -> list[str]:
        """The look-alike engine's command line for one replica listening on `port`."""
        common = ["--gpu", self.gpu, "--host", host, "--port", str(port), "--time-scale", f"{self.time_scale:g}",
                  "--load-gbps", f"{self.load_gbps:g}", "--seed", str(seed)]
        if self.flavor == "vllm":
            return [sys.executable, "-m", "fake_engines.vllm.cli", "serve", self.model, *common,
                    "-tp", str(self.tensor_parallel), "-pp", str(self.pipeline_parallel), *self._kv_transfer(),
                    *self.args]
        given = (("-c", self.ctx_size), ("-ngl", self.gpu_layers), ("-np", self.parallel))
        slots = [word for flag, value in given if value is not None for word in (flag, str(value))]
        return [sys.executable, "-m", "fake_engines.llamacpp.cli", "-m", f"{self.model}-{self.quant}.gguf",
                "-a", self.model, *slots, "--metrics", *common, *self.args]

    def _kv_transfer(self) -> list[str]:
        """A P/D role's --kv-transfer-config, unless `args` give their own."""
        if not self.role or "--kv-transfer-config" in self.args:
            return []
        kv_role = "kv_producer" if self.role == "prefill" else "kv_consumer"
        return ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role})]

    def kv_events(self, host: str = "127.0.0.1") -> KVEventsSource | None:
        """Where the group's engines publish KV-cache events, as the router at `host`'s side
        connects to them: vLLM's `--kv-events-config` JSON among `args`; None without one.
        Each replica binds the same endpoint, so a group with events runs one replica per host."""
        return KVEventsSource.from_command(self.args, host) if self.flavor == "vllm" else None

    def engine_config(self, port: int = 0) -> EngineConfig:
        """The engine config every replica of the group starts with (VllmServeConfig or
        LlamaServerConfig), read from its command line by the engine's own parser."""
        from fake_engines.factory import parse_command

        return parse_command(self.command(port=port))

    def capacity_weight(self) -> float:
        """`weight`, else what one replica can do as the capacity model has it: reference
        requests per second when full (fake_engines.capacity), so routing weighs an H100 vLLM
        replica about 17 times an RTX 4090 llama-server one. 1 when the engine cannot be sized."""
        return self.weight if self.weight is not None else _modelled_weight(tuple(self.command(port=0)))

    def check(self, where: str) -> None:
        """Every value, each named `where.KEY` when wrong."""
        if self.flavor not in ENGINE_FLAVORS:
            raise ConfigError(f"{where}.flavor", self.flavor, f"must be one of {', '.join(ENGINE_FLAVORS)}")
        if not self.model:
            raise ConfigError(f"{where}.model", self.model, "must name a catalogue model")
        for key in ("tensor_parallel", "pipeline_parallel", "ctx_size", "replicas", "max_replicas"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"{where}.{file_key(key)}", getattr(self, key), "must be >= 1")
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
        if self.role not in ("", "prefill", "decode"):
            raise ConfigError(f"{where}.role", self.role, "must be prefill or decode")
        if self.role and self.flavor != "vllm":
            raise ConfigError(f"{where}.role", self.role, "needs flavor vllm (kv_transfer_params is vLLM's protocol)")
        self._check_catalogue(where)
        self._check_flags(where)

    def _check_catalogue(self, where: str) -> None:
        """The names the engines look up at start, looked up now, so none starts to fail."""
        from fake_engines.factory.gguf import QUANT_BITS
        from fake_engines.perf.catalogue import CatalogueError, load_catalogue

        catalogue = load_catalogue()
        if self.gpu.lower() not in catalogue.gpus:
            raise ConfigError(f"{where}.gpu", self.gpu, f"is not in the catalogue ({', '.join(sorted(catalogue.gpus))})")
        # a catalogue name, a path or Hugging Face id naming one (the catalogue's rule), or for
        # fake-vllm an explicit shape (--params ...)
        explicit = self.flavor == "vllm" and "--params" in self.args
        if not explicit:
            try:
                catalogue.model(self.model)
            except CatalogueError:
                raise ConfigError(f"{where}.model", self.model,
                                  f"is not in the catalogue ({', '.join(sorted(catalogue.models))})") from None
        if self.flavor == "llamacpp" and self.quant.upper() not in QUANT_BITS:
            raise ConfigError(f"{where}.quant", self.quant, f"must be one of {', '.join(QUANT_BITS)}")

    def _check_flags(self, where: str) -> None:
        """The command line read as the engine will read it: an unknown flag or a value the
        engine refuses is an error now. What only sizing tells (a model too large for its GPU)
        shows when the engine starts."""
        from fake_engines.factory import EngineConfigError

        try:
            self.engine_config()
        except EngineConfigError as exc:
            raise ConfigError(f"{where}.args", list(self.args), str(exc)) from None


@functools.lru_cache(maxsize=64)
def _modelled_weight(command: tuple[str, ...]) -> float:
    from fake_engines.capacity import capacity_rps
    from fake_engines.factory import parse_command

    try:
        return round(capacity_rps(parse_command(command)), 2) or 1.0
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
class AutoscalerSection:
    """Scaling one engine group from inside the proxy (proxy/autoscale runs it)."""

    engines: str = ""
    """Name of the engine group it scales; default the first group whose min differs from max."""
    signals: tuple[str, ...] = ("waiting", "kv_cache_usage", "arrival_rate")
    """Signals shown to the policy, for the record; policies read the ones they need."""
    settings: Mapping[str, object] = field(default_factory=dict)
    """Every other key, as the proxy's `autoscaler:` section takes it (policy, interval_s, hold,
    ...); checked by proxy.autoscale.config."""

    @property
    def policy(self) -> str | None:
        """The scaling policy spec the file names (None: the proxy's default)."""
        policy = self.settings.get("policy")
        return str(policy) if policy else None

    def for_proxy(self, group: EngineGroup, log_dir: Path | None = None) -> dict[str, object]:
        """The proxy's `autoscaler:` section: these settings plus the group's command and limits.
        Its clock runs at the engines' time scale, so windows and cold starts stay in proportion."""
        section: dict[str, object] = {"actuator": "local", "time_scale": group.time_scale, **self.settings}
        section.update(engine_cmd=without_address(group.command(port=0)), flavor=group.flavor,
                       min=group.min_replicas, max=group.max_replicas, weight=group.capacity_weight())
        if group.role:  # P/D: the pool it scales (proxy/autoscale/setup.py)
            section["role"] = group.role
        if log_dir is not None:
            section["engine_log_dir"] = str(log_dir)
        return section

    def scaling_policy(self, group: EngineGroup, policy: str | None = None) -> ScalingPolicy:
        """The scaling policy the proxy would run for `group` (or `policy` in its place), with the
        group's min and max and the section's interval: what `flotilla sim --fleet` scales with."""
        from proxy.autoscale.config import config_from_mapping
        from proxy.autoscale.setup import build_policy

        section = self.for_proxy(group)
        if policy is not None:
            section["policy"] = policy
        return build_policy(config_from_mapping(section))

    def check(self, group: EngineGroup) -> None:
        if self.settings.get("actuator", "local") not in ACTUATORS:
            raise ConfigError("autoscaler.actuator", self.settings["actuator"],
                              f"flotilla up runs the {' or '.join(ACTUATORS)} actuator only")
        for key in ("engine_cmd", "flavor", "min", "max", "min_replicas", "max_replicas", "weight"):
            if key in self.settings:
                raise ConfigError(f"autoscaler.{key}", self.settings[key], "is set by the scaled engine group")
        try:
            self.scaling_policy(group)
        except ConfigError as exc:
            name = exc.field if exc.field.startswith("autoscaler.") else f"autoscaler.{exc.field}"
            raise ConfigError(name, exc.value, exc.reason) from None
        except ValueError as exc:  # an unknown policy name or a bad policy key
            raise ConfigError("autoscaler.policy", self.settings.get("policy"), str(exc)) from None


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
class Fleet:
    """A whole fleet: its engine groups behind the router, and what scales and judges it."""

    engines: tuple[EngineGroup, ...]
    """Engine groups, at least one."""
    port: int = 8000
    """Port of the proxy on 127.0.0.1 (`flotilla up`)."""
    policy: str = DEFAULT_POLICY
    """Routing policy spec NAME[:key=value,...] (docs/routing-policies.md)."""
    backends: tuple[BackendSpec, ...] = ()
    """The proxy section's own backends (what `flotilla proxy --config` routes to besides); not
    started, simulated or used by `flotilla up`."""
    scrape_interval_s: float | None = None
    """Modelled seconds between the proxy's scrapes of engine metrics; None: the proxy's default
    live, exact engine state in the simulator."""
    autoscaler: AutoscalerSection | None = None
    """None: every group keeps its `replicas`."""
    slo: Slo | None = None
    """Goodput objectives (modelled seconds) the simulator and the fixtures judge runs by."""
    demo: DemoSection = field(default_factory=DemoSection)
    """What `flotilla up --demo` replays."""
    seed: int = 0
    """Seeds the routing policy's random choices in the simulator and the fixtures (engines take
    `--seed` among their flags)."""

    def scaled_group(self) -> EngineGroup | None:
        """The group the autoscaler owns, if any."""
        return self.autoscaled()[1] if self.autoscaler is not None else None

    def autoscaled(self) -> tuple[AutoscalerSection, EngineGroup]:
        """The autoscaler section (the file's, else every default) and the group it scales: what
        the simulator scales when asked to, with or without an `autoscaler:` section."""
        section = self.autoscaler or AutoscalerSection()
        if section.engines:
            return section, next(g for g in self.engines if g.name == section.engines)
        return section, next((g for g in self.engines if g.min_replicas != g.max_replicas), self.engines[0])

    def started(self) -> list[EngineGroup]:
        """One entry per replica `flotilla up` starts, in the order its proxy lists them: the
        fixed groups' replicas in file order, then the `replicas` of the scaled group (its
        autoscaler starts them with the proxy, so they are listed after)."""
        scaled = self.scaled_group()
        groups = [g for g in self.engines if g is not scaled] + ([scaled] if scaled is not None else [])
        return [g for g in groups for _ in range(g.replicas)]

    @property
    def time_scale(self) -> float:
        """The engines' time scale; the smallest where groups differ."""
        return min(g.time_scale for g in self.engines)


def file_key(attr: str) -> str:
    """The fleet-file key of an EngineGroup field (`min_replicas` is `min`)."""
    return {"min_replicas": "min", "max_replicas": "max"}.get(attr, attr)
