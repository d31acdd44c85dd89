"""Proxy configuration: dataclasses with defaults, validation that names the field, fleet files.

A fleet file for the proxy is YAML; either the keys below at the top level or under `proxy:`::

    policy: least-outstanding
    backends:
      - url: http://127.0.0.1:8001
        flavor: vllm          # vllm | llamacpp | openai
        models: [llama-3.1-8b, sql-lora]
        weight: 1.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from proxy.limits import LimitsConfig

FLAVORS = ("vllm", "llamacpp", "openai")


class ConfigError(ValueError):
    """A configuration value is invalid; `field` names it."""

    def __init__(self, field_name: str, value: object, reason: str) -> None:
        super().__init__(f"{field_name}={value!r}: {reason}")
        self.field = field_name
        self.value = value
        self.reason = reason


def _positive(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if not value > 0:
            raise ConfigError(name, value, "must be > 0")


@dataclass(frozen=True)
class BackendSpec:
    """One engine as the operator declared it."""

    url: str
    """Base URL without the /v1 suffix, e.g. http://127.0.0.1:8001."""
    flavor: str = "openai"
    """vllm, llamacpp or openai: selects the metric names and the health semantics."""
    models: tuple[str, ...] = ()
    """Models (and adapters) served; empty means learn them from GET /v1/models."""
    weight: float = 1.0
    """Relative capacity for weighted policies."""

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError("url", self.url, "must be http(s)://host:port")
        if self.flavor not in FLAVORS:
            raise ConfigError("flavor", self.flavor, f"must be one of {', '.join(FLAVORS)}")
        if not self.weight > 0:
            raise ConfigError("weight", self.weight, "must be > 0")
        object.__setattr__(self, "url", self.url.rstrip("/"))


@dataclass
class TimeoutConfig:
    """Upstream timeouts; every one is finite so no request waits forever."""

    connect_s: float = 5.0
    """TCP connect to a backend."""
    first_byte_s: float = 300.0
    """From sending the request to the response headers (covers queueing and prefill)."""
    idle_s: float = 60.0
    """Longest gap between two chunks of a response body."""
    total_s: float = 1800.0
    """Whole request, first attempt to last byte."""

    def __post_init__(self) -> None:
        _positive(self, "connect_s", "first_byte_s", "idle_s", "total_s")


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
    chars_per_token: float = 4.0
    """Prompt-length estimate used for token reservations when no tokenizer is at hand."""
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Admission queues, rate limits, client keys, backend allow-list, shutdown grace."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("port", self.port, "must be in [0, 65535]")
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
        raise ConfigError("backends", item, "each backend needs a url")
    models = item.get("models") or ()
    if isinstance(models, str):
        models = (models,)
    return BackendSpec(url=str(item["url"]), flavor=str(item.get("flavor", "openai")),
                       models=tuple(str(m) for m in models), weight=float(item.get("weight", 1.0)))


@dataclass(frozen=True)
class FleetFile:
    """What the proxy reads from a fleet file."""

    backends: tuple[BackendSpec, ...]
    policy: str | None = None


def parse_fleet(text: str) -> FleetFile:
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ConfigError("fleet", type(data).__name__, "must be a mapping")
    section = data.get("proxy", data) if isinstance(data.get("proxy"), dict) else data
    items = section.get("backends", data.get("backends")) or []
    if not isinstance(items, list):
        raise ConfigError("backends", items, "must be a list")
    policy = section.get("policy")
    return FleetFile(backends=tuple(backend_from_mapping(i) for i in items),
                     policy=str(policy) if policy else None)


def load_fleet(path: Path) -> FleetFile:
    return parse_fleet(path.read_text())
