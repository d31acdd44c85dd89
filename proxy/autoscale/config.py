"""The autoscaler's settings: from `flotilla proxy` flags or a fleet file's `autoscaler:` section.

    autoscaler:
      policy: cold-start-aware:capacity_rps=2
      actuator: local                 # local | docker | kubernetes
      engine_cmd: fake-vllm serve llama-3.1-8b --gpu h100 --time-scale 0.05
      min: 1
      max: 4
      interval_s: 5
      recommend_only: false           # true: decide and export, let HPA or KEDA act
      pool: vllm                      # the `pool` label of flotilla_autoscaler_desired_replicas

A P/D proxy (docs/pd.md) scales each pool on its own: the section is then a list, one mapping
per pool, each with `role: prefill` or `role: decode` (policies pd-prefill and pd-decode).
Flags given on the command line win over the file (over its decode section when it has several).
"""

from __future__ import annotations

import argparse
import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from policies.scaling import create_policy
from proxy.config import FLAVORS, ConfigError, load_yaml, read_config_file

ACTUATORS = ("local", "docker", "kubernetes")
ROLES = ("", "prefill", "decode")


@dataclass
class HoldSettings:
    """Bounds on holding requests; seconds are real (what the client waits)."""

    max_requests: int = 256
    """Requests held at once; one more is answered 503 at once."""
    max_wait_s: float = 600.0
    """Longest a request is held before a 503."""
    keepalive_s: float = 10.0
    """Seconds between SSE comment lines to a held stream (the first comes after this long)."""
    poll_s: float = 0.05
    """How often a held request looks for a ready backend."""

    def __post_init__(self) -> None:
        if self.max_requests < 0:
            raise ValueError(f"max_requests={self.max_requests!r}: must be >= 0")
        for name in ("max_wait_s", "keepalive_s", "poll_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be > 0")


@dataclass
class AutoscaleConfig:
    """Everything the autoscaler inside the proxy needs."""

    policy: str = "cold-start-aware"
    """Scaling policy spec NAME[:key=value,...] (docs/autoscaling.md)."""
    actuator: str = "local"
    """local (engine processes), docker (containers) or kubernetes (a Deployment/StatefulSet)."""
    engine_cmd: str | None = None
    """local: one replica's command line; the actuator appends --host 127.0.0.1 --port N.
    docker: the command inside the container (optional)."""
    flavor: str | None = None
    """vllm, llamacpp or openai; default guessed from engine_cmd, else vllm."""
    weight: float = 1.0
    """Capacity weight of every replica it starts (`BackendSpec.weight`, read by routing)."""
    min_replicas: int | None = None
    """Floor; None keeps the policy spec's (default 1)."""
    max_replicas: int | None = None
    """Ceiling; None keeps the policy spec's (default 100)."""
    interval_s: float | None = None
    """Seconds between decisions; None keeps the policy's own."""
    sample_interval_s: float | None = None
    """Seconds between signal samples; None: the decision interval, at most 2 s."""
    time_scale: float = 1.0
    """Real seconds per autoscaler second (0.05: windows and cooldowns run 20x faster)."""
    drain_timeout_s: float = 300.0
    """Longest wait for a draining replica's requests (autoscaler seconds)."""
    stop_grace_s: float = 30.0
    """Real seconds from the graceful stop of a drained replica to a forced one."""
    prometheus_url: str | None = None
    """Read signals from this Prometheus server instead of the proxy's own scrapes."""
    prometheus_queries: tuple[str, ...] = ()
    """FIELD=PROMQL overrides of the default queries."""
    engine_log_dir: Path | None = None
    """local: where each replica logs; None discards engine output."""
    hold: HoldSettings = field(default_factory=HoldSettings)
    docker: dict = field(default_factory=dict)
    """DockerSettings fields (socket_path, image, network, port, labels, compose_service, fleet)."""
    kubernetes: dict = field(default_factory=dict)
    """KubernetesSettings fields (workload, service, namespace, port_name, kubeconfig, context)."""
    recommend_only: bool = False
    """Decide and export `flotilla_autoscaler_desired_replicas{pool}`, start and stop nothing: HPA
    or KEDA acts on the metric. The fleet the policy sees is the kubernetes actuator's pods (it
    only watches them), else every replica in the proxy's pool."""
    pool: str | None = None
    """The `pool` label of the desired-replicas metric; None: the role, else the Kubernetes
    workload's name, else `default`."""
    role: str = ""
    """P/D (docs/pd.md): `prefill` scales the prefill pool, `decode` (or "") the proxy's ordinary pool."""

    @property
    def pool_label(self) -> str:
        if self.pool or self.role:
            return self.pool or self.role
        workload = self.kubernetes.get("workload") if self.actuator == "kubernetes" else None
        return str(workload).rpartition("/")[2] if workload else "default"

    def __post_init__(self) -> None:
        try:
            create_policy(self.policy)  # a bad spec fails here, naming the setting at fault
        except ValueError as exc:  # an unknown name, or a key or value the registry names
            raise ConfigError("policy", self.policy, str(exc)) from None
        if self.role not in ROLES:
            raise ConfigError("role", self.role, "must be prefill or decode")
        if self.actuator not in ACTUATORS:
            raise ConfigError("actuator", self.actuator, f"must be one of {', '.join(ACTUATORS)}")
        if self.flavor is not None and self.flavor not in FLAVORS:
            raise ConfigError("flavor", self.flavor, f"must be one of {', '.join(FLAVORS)}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, int | float) or not 0 < self.weight < float("inf"):
            raise ConfigError("weight", self.weight, "must be a number > 0")
        needs_cmd = self.actuator == "local" and not self.recommend_only
        if needs_cmd and not (self.engine_cmd and shlex.split(self.engine_cmd)):
            raise ConfigError("engine_cmd", self.engine_cmd, "the local actuator needs the engine command line")
        for name in ("interval_s", "sample_interval_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(name, value, "must be > 0")
        for name in ("time_scale", "drain_timeout_s", "stop_grace_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "must be > 0")
        for name in ("min_replicas", "max_replicas"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(name, value, "must be >= 0")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The autoscaler's flags of `flotilla proxy`."""
    g = parser.add_argument_group("autoscaler")
    g.add_argument("--autoscale", metavar="SPEC", default=None,
                   help="run the autoscaler with this scaling policy NAME[:key=value,...]")
    g.add_argument("--autoscale-recommend-only", action="store_true", default=None,
                   help="decide and export flotilla_autoscaler_desired_replicas{pool} on /metrics, start and "
                        "stop nothing (HPA or KEDA scales; docs/autoscaling.md#hpa-and-keda)")
    g.add_argument("--autoscale-pool", default=None, metavar="NAME",
                   help="the pool label of that metric (default: the Kubernetes workload's name, else default)")
    g.add_argument("--actuator", choices=ACTUATORS, default=None, help="how replicas start and stop (default local)")
    g.add_argument("--engine-cmd", default=None, help="one replica's command line (local actuator)")
    g.add_argument("--engine-flavor", choices=FLAVORS, default=None, help="default: guessed from --engine-cmd")
    g.add_argument("--min-replicas", type=int, default=None)
    g.add_argument("--max-replicas", type=int, default=None)
    g.add_argument("--autoscale-interval-s", type=float, default=None, help="seconds between decisions")
    g.add_argument("--autoscale-time-scale", type=float, default=None,
                   help="real seconds per autoscaler second, as the engines' --time-scale")
    g.add_argument("--drain-timeout-s", type=float, default=None)
    g.add_argument("--prometheus-url", default=None, help="read signals from this Prometheus server")
    g.add_argument("--prometheus-query", action="append", default=[], metavar="FIELD=PROMQL")
    g.add_argument("--engine-log-dir", type=Path, default=None)
    g.add_argument("--hold-max-requests", type=int, default=None, help="requests held while no replica is ready")
    g.add_argument("--hold-max-wait-s", type=float, default=None, help="longest hold before a 503")
    g.add_argument("--docker-image", default=None)
    g.add_argument("--docker-socket", default=None)
    g.add_argument("--docker-network", default=None)
    g.add_argument("--docker-compose-service", default=None)
    g.add_argument("--k8s-workload", default=None, metavar="KIND/NAME", help="deployment/NAME or statefulset/NAME")
    g.add_argument("--k8s-service", default=None)
    g.add_argument("--k8s-namespace", default=None)
    g.add_argument("--kubeconfig", type=Path, default=None)


# flag -> (config field, nested section or None)
_FLAGS = {
    "autoscale": ("policy", None), "actuator": ("actuator", None),
    "autoscale_recommend_only": ("recommend_only", None), "autoscale_pool": ("pool", None), "engine_cmd": ("engine_cmd", None),
    "engine_flavor": ("flavor", None), "min_replicas": ("min_replicas", None),
    "max_replicas": ("max_replicas", None), "autoscale_interval_s": ("interval_s", None),
    "autoscale_time_scale": ("time_scale", None), "drain_timeout_s": ("drain_timeout_s", None),
    "prometheus_url": ("prometheus_url", None), "engine_log_dir": ("engine_log_dir", None),
    "hold_max_requests": ("max_requests", "hold"), "hold_max_wait_s": ("max_wait_s", "hold"),
    "docker_image": ("image", "docker"), "docker_socket": ("socket_path", "docker"),
    "docker_network": ("network", "docker"), "docker_compose_service": ("compose_service", "docker"),
    "k8s_workload": ("workload", "kubernetes"), "k8s_service": ("service", "kubernetes"),
    "k8s_namespace": ("namespace", "kubernetes"), "kubeconfig": ("kubeconfig", "kubernetes"),
}


def config_from_args(args: argparse.Namespace) -> AutoscaleConfig | None:
    """The autoscaler asked for by flags and the --config file's `autoscaler:` section; None when
    neither asks for one (the decode pool's, when the file scales several: configs_from_args)."""
    return next((c for c in configs_from_args(args) if c.role != "prefill"), None)


def configs_from_args(args: argparse.Namespace) -> list[AutoscaleConfig]:
    """One autoscaler per pool: the --config file's `autoscaler:` sections, the flags laid over
    its decode (or colocated) one, or making one when it has none and --autoscale is given."""
    sections = file_sections(getattr(args, "config", None))
    ordinary = next((i for i, s in enumerate(sections) if s.get("role") != "prefill"), None)
    if ordinary is None and getattr(args, "autoscale", None) is not None:
        sections, ordinary = [*sections, {}], len(sections)
    configs = [config_from_mapping(_with_flags(s, args) if i == ordinary else s) for i, s in enumerate(sections)]
    return sorted(configs, key=lambda c: c.role == "prefill")  # the ordinary pool's first: it owns the fleet series


def _with_flags(section: dict, args: argparse.Namespace) -> dict:
    raw = dict(section)
    for flag, (name, nested) in _FLAGS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        if nested is None:
            raw[name] = value
        else:
            raw[nested] = {**(raw.get(nested) or {}), name: value}
    if getattr(args, "prometheus_query", None):
        raw["prometheus_queries"] = tuple(args.prometheus_query)
    return raw


def file_section(path: Path | None) -> dict | None:
    """The `autoscaler:` mapping of a fleet file (top level or under `proxy:`), if it has one
    (the decode pool's, when it lists several)."""
    return next((s for s in file_sections(path) if s.get("role") != "prefill"), None)


def file_sections(path: Path | None) -> list[dict]:
    """The `autoscaler:` section of a fleet file (top level or under `proxy:`): a mapping, or a
    list of them with one `role` each (a P/D proxy's two pools)."""
    if path is None:
        return []
    data = load_yaml(read_config_file(Path(path)), str(path)) or {}
    if not isinstance(data, dict):
        return []
    section = data.get("autoscaler")
    if section is None and isinstance(data.get("proxy"), dict):
        section = data["proxy"].get("autoscaler")
    sections = section if isinstance(section, list) else [] if section is None else [section]
    try:
        for item in sections:
            if not isinstance(item, dict):
                raise ConfigError("autoscaler", item, "must be a mapping, or a list of them (one per P/D role)")
            check_types(item)
        roles = ["prefill" if item.get("role") == "prefill" else "decode" for item in sections]
        if len(set(roles)) < len(roles):
            raise ConfigError("autoscaler.role", roles, "one section per pool: prefill, decode")
    except ConfigError as exc:
        raise exc.located(str(path)) from None
    return [dict(item) for item in sections]


# Keys of `flotilla up`'s autoscaler section that describe the engine group, not this process.
_UP_KEYS = frozenset({"engines", "signals"})
_FILE_ALIASES = {"min": "min_replicas", "max": "max_replicas"}


def _anything(_value: object) -> bool:
    return True


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is(*kinds: type) -> Callable[[object], bool]:
    return lambda value: isinstance(value, kinds) and not isinstance(value, bool)


# config field -> (type check, what it must be); the values are then AutoscaleConfig's to check
_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "policy": (_is(str), "a policy spec NAME[:key=value,...]"), "actuator": (_is(str), "a string"),
    "engine_cmd": (_is(str, list), "a command line (a string or a list of words)"),
    "flavor": (_is(str), "a string"), "min_replicas": (_is(int), "an integer"),
    "max_replicas": (_is(int), "an integer"), "interval_s": (_number, "a number"),
    "sample_interval_s": (_number, "a number"), "time_scale": (_number, "a number"),
    "drain_timeout_s": (_number, "a number"), "stop_grace_s": (_number, "a number"),
    "prometheus_url": (_is(str), "a string"), "engine_log_dir": (_is(str, Path), "a path"),
    "prometheus_queries": (lambda v: isinstance(v, list | tuple) and all(isinstance(q, str) for q in v),
                           "a list of FIELD=PROMQL strings"),
    "hold": (_is(dict), "a mapping"), "docker": (_is(dict), "a mapping"), "kubernetes": (_is(dict), "a mapping"),
    "recommend_only": (lambda v: isinstance(v, bool), "true or false"), "pool": (_is(str), "a string"),
    "role": (_is(str), "prefill or decode"),
}


def check_types(raw: dict) -> None:
    """Every key known and every value of its type (None keeps the default); an error names
    autoscaler.KEY. The values themselves are AutoscaleConfig's to check."""
    known = {f.name for f in fields(AutoscaleConfig)}
    for key, value in raw.items():
        name = _FILE_ALIASES.get(key, key)
        if key in _UP_KEYS:
            continue
        if name not in known:
            raise ConfigError(f"autoscaler.{key}", value, f"unknown key; known: {', '.join(sorted(known))}")
        check, what = _TYPES.get(name, (_anything, ""))
        if value is not None and not check(value):
            raise ConfigError(f"autoscaler.{key}", value, f"must be {what}")
        if name == "hold" and isinstance(value, dict):
            for hold_key, number in value.items():
                if not _number(number):
                    raise ConfigError(f"autoscaler.hold.{hold_key}", number, "must be a number")


def config_from_mapping(raw: dict) -> AutoscaleConfig:
    """An AutoscaleConfig from a fleet file section (or flags merged into one)."""
    check_types(raw)
    kwargs = {_FILE_ALIASES.get(k, k): v for k, v in raw.items() if k not in _UP_KEYS and v is not None}
    if isinstance(kwargs.get("hold"), dict):
        try:
            kwargs["hold"] = HoldSettings(**kwargs["hold"])
        except (TypeError, ValueError) as exc:
            raise ConfigError("autoscaler.hold", kwargs["hold"], str(exc)) from None
    if isinstance(kwargs.get("engine_cmd"), list):
        kwargs["engine_cmd"] = shlex.join(str(w) for w in kwargs["engine_cmd"])
    if kwargs.get("engine_log_dir") is not None:
        kwargs["engine_log_dir"] = Path(kwargs["engine_log_dir"])
    if "prometheus_queries" in kwargs:
        kwargs["prometheus_queries"] = tuple(kwargs["prometheus_queries"])
    return AutoscaleConfig(**kwargs)
