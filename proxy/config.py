"""Proxy configuration: dataclasses with defaults, validation that names the field, fleet files.

A fleet file for the proxy is YAML; either the keys below at the top level or under `proxy:`::

    policy: least-outstanding
    backends:
      - url: http://127.0.0.1:8001
        flavor: vllm          # vllm | llamacpp | openai
        models: [llama-3.1-8b, sql-lora]
        weight: 1.0
        api_key: sk-...       # optional: sent to this backend as Authorization: Bearer
        kv_events: tcp://127.0.0.1:5557   # optional: the engine's KV-cache event publisher
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import yaml

from flotilla.errors import ConfigError as ConfigError  # re-exported: `from proxy.config import ConfigError`
from proxy.limits import LimitsConfig

FLAVORS = ("vllm", "llamacpp", "openai")


class ConfigFileError(ConfigError):
    """A configuration file that cannot be read or is not valid YAML: `WHERE: PROBLEM`, where
    WHERE is the path, with `:line:column` (1-based) for a syntax error."""

    def __init__(self, where: str, problem: str) -> None:
        ValueError.__init__(self, f"{where}: {problem}")
        self.field, self.value, self.reason, self.source = "fleet", where, problem, where

    def located(self, source: str) -> ConfigError:
        return self  # already says where


def load_yaml(text: str, source: str) -> object:
    """yaml.safe_load; text that is not YAML is a ConfigFileError naming source:line:column."""
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = ", ".join(p for p in (exc.context, exc.problem) if p)
        raise ConfigFileError(where, f"invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:  # a control character; position counts characters
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        raise ConfigFileError(f"{source}:{line}:{column}", f"invalid YAML: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(source, f"invalid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigFileError(source, "invalid YAML: nested too deeply") from None


def read_config_file(path: Path) -> str:
    """The text of a configuration file; a missing or unreadable one is a ConfigFileError."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigFileError(str(path), "not UTF-8 text") from None
    except OSError as exc:
        raise ConfigFileError(str(path), f"cannot read: {exc.strerror or exc}") from None


def _positive(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if not value > 0:
            raise ConfigError(name, value, "must be > 0")


def redact_url(url: str) -> str:
    """`url` without its `user:password@` part: what logs, metrics and headers may show."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.rpartition("@")[2]
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


@dataclass(frozen=True)
class KVEventsSource:
    """Where a backend publishes vLLM's KV-cache events (its `--kv-events-config`), as the
    router connects to it."""

    endpoint: str
    """ZMQ PUB address to subscribe to, e.g. tcp://10.0.0.5:5557."""
    replay_endpoint: str | None = None
    """ZMQ ROUTER address that replays missed batches; None: gaps clear and resync."""
    topic: str = ""
    """Topic the publisher sends under (vLLM's default: empty)."""

    def __post_init__(self) -> None:
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.startswith(("tcp://", "ipc://"))):
                raise ConfigError(name, value, "must be a ZMQ address, tcp://host:port or ipc://path")

    @classmethod
    def from_vllm_config(cls, config: Mapping[str, object], host: str) -> KVEventsSource | None:
        """The source of an engine started with `--kv-events-config` CONFIG and reached at
        `host`: vLLM's field names; a wildcard bind address (tcp://*:5557) is the engine's host.
        None when the config does not enable ZMQ events."""
        if not config.get("enable_kv_cache_events") or config.get("publisher", "null") != "zmq":
            return None
        endpoint = str(config.get("endpoint") or "tcp://*:5557")
        replay = config.get("replay_endpoint")
        return cls(endpoint=_connectable(endpoint, host),
                   replay_endpoint=_connectable(str(replay), host) if replay else None,
                   topic=str(config.get("topic") or ""))

    @classmethod
    def from_command(cls, argv: Sequence[str], host: str) -> KVEventsSource | None:
        """The source of an engine whose command line is `argv` (its last `--kv-events-config`
        JSON, as vLLM reads it), reached at `host`; None without one or when it cannot be read
        (the engine itself refuses such a command)."""
        text = None
        for i, word in enumerate(argv):
            if word == "--kv-events-config" and i + 1 < len(argv):
                text = argv[i + 1]
            elif word.startswith("--kv-events-config="):
                text = word.partition("=")[2]
        try:
            config = json.loads(text) if text is not None else None
        except ValueError:
            return None
        return cls.from_vllm_config(config, host) if isinstance(config, dict) else None

    @classmethod
    def parse(cls, value: object, host: str) -> KVEventsSource:
        """A fleet file's `kv_events:` value: an endpoint string, or a mapping with `endpoint`,
        `replay_endpoint` and `topic` (vLLM's names; wildcard hosts are the backend's host)."""
        if isinstance(value, str):
            return cls(endpoint=_connectable(value, host))
        if not isinstance(value, Mapping) or not isinstance(value.get("endpoint"), str):
            raise ConfigError("kv_events", value, "must be a ZMQ endpoint or a mapping with an endpoint")
        replay = value.get("replay_endpoint")
        return cls(endpoint=_connectable(str(value["endpoint"]), host),
                   replay_endpoint=_connectable(str(replay), host) if replay else None,
                   topic=str(value.get("topic") or ""))


def _connectable(endpoint: str, host: str) -> str:
    """A bind address as a subscriber connects to it: `*`, 0.0.0.0 or :: become `host`."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme != "tcp" or not sep:
        return endpoint
    address, colon, port = rest.rpartition(":")
    if colon and address in ("*", "0.0.0.0", "::", "[::]"):
        return f"tcp://{host}:{port}"
    return endpoint


BACKEND_ROLES = ("", "prefill", "decode")
"""A backend's part in disaggregated serving; "": colocated (or decode)."""


@dataclass(frozen=True)
class BackendSpec:
    """One engine as the operator declared it."""

    url: str
    """Base URL without the /v1 suffix, e.g. http://127.0.0.1:8001. A `user:password@` in the
    given URL moves to `basic_auth`, so `url` never carries credentials (it is the backend's
    name in metrics, headers, logs and the admin API)."""
    flavor: str = "openai"
    """vllm, llamacpp or openai: selects the metric names and the health semantics."""
    models: tuple[str, ...] = ()
    """Models (and adapters) served; empty means learn them from GET /v1/models."""
    weight: float = 1.0
    """Relative capacity for weighted policies."""
    api_key: str | None = field(default=None, repr=False)
    """Sent to this backend as `Authorization: Bearer` in place of anything the client sent."""
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    """(user, password) from the URL, sent to this backend as `Authorization: Basic`."""
    kv_events: KVEventsSource | None = None
    """The engine's KV-cache event publisher; None: it publishes none (routing policies that
    read the KV index fall back to their own approximate index for it)."""
    role: str = ""
    """Disaggregated serving (proxy/pd.py): "prefill" puts the backend in the prefill pool,
    "decode" (or "") in the ordinary pool, which then decodes."""

    def __post_init__(self) -> None:
        shown = redact_url(self.url)
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
        except ValueError:
            raise ConfigError("url", shown, "must be http(s)://host:port") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("url", shown, "must be http(s)://host:port")
        if self.flavor not in FLAVORS:
            raise ConfigError("flavor", self.flavor, f"must be one of {', '.join(FLAVORS)}")
        if not self.weight > 0:
            raise ConfigError("weight", self.weight, "must be > 0")
        if self.role not in BACKEND_ROLES:
            raise ConfigError("role", self.role, "must be prefill or decode")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ConfigError("api_key", "<redacted>", "must be a non-empty string")
        if parts.username is not None:
            if self.api_key is not None:
                raise ConfigError("api_key", "<redacted>", "give credentials in the url or api_key, not both")
            user, password = unquote(parts.username), unquote(parts.password or "")
            object.__setattr__(self, "basic_auth", (user, password))
        object.__setattr__(self, "url", shown.rstrip("/"))

    @property
    def authorization(self) -> str | None:
        """The Authorization header this backend needs, if the operator gave it credentials."""
        if self.api_key is not None:
            return f"Bearer {self.api_key}"
        if self.basic_auth is not None:
            token = base64.b64encode(":".join(self.basic_auth).encode()).decode()
            return f"Basic {token}"
        return None


@dataclass
class TimeoutConfig:
    """Timeouts of a forwarded request, both legs; every one is finite so no request waits forever."""

    connect_s: float = 5.0
    """TCP connect to a backend."""
    first_byte_s: float = 300.0
    """From sending the request to the response headers (covers queueing and prefill)."""
    idle_s: float = 60.0
    """Longest gap between two chunks of a response body."""
    total_s: float = 1800.0
    """Whole request, first attempt to last byte."""
    client_write_s: float = 30.0
    """Longest wait for a client to take one chunk of the response (a client that stopped
    reading): past it the client's connection is dropped and the engine request aborted."""

    def __post_init__(self) -> None:
        _positive(self, "connect_s", "first_byte_s", "idle_s", "total_s", "client_write_s")


@dataclass
class RetryConfig:
    """Retries before the first byte reached the client (never after)."""

    max_attempts: int = 3
    """Tries in all, the first included; each retry goes to a backend not tried yet."""
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.1
    """Relative jitter: the backoff is scaled by a uniform factor in [1 - jitter, 1 + jitter]."""
    max_retry_after_s: float = 5.0
    """A backend's Retry-After is honoured up to this; longer waits go to another backend at once."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("max_attempts", self.max_attempts, "must be >= 1")
        _positive(self, "initial_backoff_s", "max_backoff_s", "multiplier")
        if not 0 <= self.jitter < 1:
            raise ConfigError("jitter", self.jitter, "must be in [0, 1)")
        if self.max_retry_after_s < 0:
            raise ConfigError("max_retry_after_s", self.max_retry_after_s, "must be >= 0")


@dataclass
class BreakerConfig:
    """Per-backend circuit breaker."""

    failure_threshold: int = 5
    """Consecutive failures that open the circuit (the backend becomes ejected)."""
    success_threshold: int = 2
    """Consecutive half-open successes that close it again."""
    open_s: float = 30.0
    """Time the circuit stays open before a half-open probe is let through."""

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ConfigError("failure_threshold", self.failure_threshold, "must be >= 1")
        if self.success_threshold < 1:
            raise ConfigError("success_threshold", self.success_threshold, "must be >= 1")
        _positive(self, "open_s")


@dataclass
class HealthConfig:
    """Active probes of each backend's /health."""

    interval_s: float = 1.0
    timeout_s: float = 2.0

    def __post_init__(self) -> None:
        _positive(self, "interval_s", "timeout_s")


@dataclass
class ProxyConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "least-outstanding"
    """Routing policy spec NAME[:key=value,...]."""
    backends: list[BackendSpec] = field(default_factory=list)
    config_path: Path | None = None
    """Fleet file watched for changes; its backend list replaces the file-managed backends."""
    reload_interval_s: float = 1.0
    admin_token: str | None = None
    """Bearer token for /admin/*; None disables the admin API."""
    scrape_interval_s: float = 0.25
    scrape_timeout_s: float = 1.0
    max_body_bytes: int = 32 * 1024 * 1024
    session_header: str = "x-session-id"
    stream_usage: bool = True
    """Ask engines for usage on every stream (stream_options.include_usage) to count each backend's
    prefill tokens; the usage event is removed again for clients that did not ask for it."""
    fast_path: bool = True
    """Serve completions and chat on proxy/fastpath.py (False: every request through aiohttp's server)."""
    chars_per_token: float = 4.0
    """Prompt-length estimate used for token reservations when no tokenizer is at hand."""
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Admission queues, rate limits, client keys, backend allow-list, shutdown grace."""
    prefill_backends: list[BackendSpec] = field(default_factory=list)
    """Disaggregated prefill/decode (proxy/pd.py): the prefill pool; `backends` is then the
    decode pool. Empty: colocated serving."""
    prefill_policy: str = "prefix-aware"
    """Routing policy spec of the prefill pool."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("port", self.port, "must be in [0, 65535]")
        # a fleet file's `role: prefill` backends form the prefill pool (proxy/pd.py)
        self.prefill_backends = [*self.prefill_backends, *(b for b in self.backends if b.role == "prefill")]
        self.backends = [b for b in self.backends if b.role != "prefill"]
        _positive(self, "reload_interval_s", "scrape_interval_s", "scrape_timeout_s", "max_body_bytes",
                  "chars_per_token")


def parse_backend_arg(text: str) -> BackendSpec:
    """`URL` or `flavor=URL` (as given to --backend)."""
    flavor, sep, url = text.partition("=")
    if sep and not flavor.startswith("http"):
        return BackendSpec(url=url, flavor=flavor)
    return BackendSpec(url=text)


def backend_from_mapping(item: object) -> BackendSpec:
    if isinstance(item, str):
        return parse_backend_arg(item)
    if not isinstance(item, dict) or "url" not in item:
        shown = {k: v for k, v in item.items() if k != "api_key"} if isinstance(item, dict) else item
        raise ConfigError("backends", shown, "each backend needs a url")
    models = item.get("models") or ()
    if isinstance(models, str):
        models = (models,)
    events = item.get("kv_events")
    source = KVEventsSource.parse(events, _host_of(str(item["url"]))) if events is not None else None
    return BackendSpec(url=str(item["url"]), flavor=str(item.get("flavor", "openai")),
                       models=tuple(str(m) for m in models), weight=float(item.get("weight", 1.0)),
                       api_key=item.get("api_key"), kv_events=source, role=str(item.get("role") or ""))


def _host_of(url: str) -> str:
    try:
        return urlsplit(url).hostname or "127.0.0.1"
    except ValueError:
        return "127.0.0.1"


@dataclass(frozen=True)
class FleetFile:
    """What the proxy reads from a fleet file."""

    backends: tuple[BackendSpec, ...]
    policy: str | None = None


def check_backend_types(item: object, where: str) -> None:
    """A fleet file's backend entry has the right shape (the values are BackendSpec's to check):
    a URL string, or a mapping of known keys with values of the right types."""
    if isinstance(item, str):
        return
    if not isinstance(item, dict):
        raise ConfigError(where, item, "must be a URL or a mapping with a url")
    if "url" not in item:
        raise ConfigError(f"{where}.url", None, "is required")
    for key, value in item.items():
        if key not in _BACKEND_KEYS:
            raise ConfigError(f"{where}.{key}", value, f"unknown key; known: {', '.join(_BACKEND_KEYS)}")
        kind, what = _BACKEND_KEYS[key]
        if not kind(value):
            shown = "<redacted>" if key == "api_key" else value
            raise ConfigError(f"{where}.{key}", shown, f"must be {what}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# backend key -> (type check, what it must be)
_BACKEND_KEYS: dict[str, tuple[Callable[[object], bool], str]] = {
    "url": (lambda v: isinstance(v, str), "a string, http(s)://host:port"),
    "flavor": (lambda v: isinstance(v, str), f"a string, one of {', '.join(FLAVORS)}"),
    "models": (lambda v: isinstance(v, str) or isinstance(v, list) and all(isinstance(m, str) for m in v),
               "a model name or a list of model names (quote names YAML reads as numbers)"),
    "weight": (_is_number, "a finite number"),
    "api_key": (lambda v: isinstance(v, str), "a string"),
    "kv_events": (lambda v: isinstance(v, str | dict), "a ZMQ endpoint or a mapping with endpoint, replay_endpoint "
                  "and topic"),
    "role": (lambda v: v in ("prefill", "decode"), "prefill or decode (disaggregated serving, docs/pd.md)"),
}


def parse_fleet(text: str, source: str | None = None) -> FleetFile:
    """A fleet file's backends and policy; an error names the field by its path in the file, e.g.
    backends[1].models, and with `source` the file too."""
    data = load_yaml(text, source or "<fleet file>") or {}
    try:
        return _fleet(data)
    except ConfigError as exc:
        raise (exc.located(source) if source else exc) from None


def _fleet(data: object) -> FleetFile:
    if not isinstance(data, dict):
        raise ConfigError("fleet", type(data).__name__, "must be a mapping")
    section = data["proxy"] if isinstance(data.get("proxy"), dict) else data
    where = "proxy." if section is not data and "backends" in section else ""
    return proxy_section({"backends": section.get("backends", data.get("backends")), "policy": section.get("policy")},
                         where)


def proxy_section(section: Mapping[str, object], prefix: str = "") -> FleetFile:
    """The backends and routing policy of a fleet file's proxy section: the one parser of both,
    for `flotilla proxy --config` and the fleet model (flotilla.fleet). Errors name the key by
    its path, `prefix` first (`proxy.backends[1].url`)."""
    items = section.get("backends") or []
    if not isinstance(items, list):
        raise ConfigError(f"{prefix}backends", items, "must be a list")
    policy = section.get("policy")
    if policy is not None and not isinstance(policy, str):
        raise ConfigError(f"{prefix}policy", policy, "must be a policy spec NAME[:key=value,...]")
    return FleetFile(backends=tuple(_backend(item, f"{prefix}backends[{i}]") for i, item in enumerate(items)),
                     policy=policy or None)


def _backend(item: object, where: str) -> BackendSpec:
    check_backend_types(item, where)
    try:
        return backend_from_mapping(item)
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc.field}", exc.value, exc.reason) from None


def load_fleet(path: Path) -> FleetFile:
    """Read and parse a fleet file; every error is a ConfigError whose message names the file."""
    return parse_fleet(read_config_file(path), str(path))
