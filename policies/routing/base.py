"""What every routing policy sees and returns.

A policy is pure: it gets a snapshot of the backends and a parsed request and returns a
decision. It never reads the clock, sleeps or does I/O, so the same object runs in the proxy,
in time-scaled tests and in the simulator.
"""

from __future__ import annotations

import abc
import enum
import random
from collections.abc import Mapping, Sequence
from typing import ClassVar

import msgspec


class BackendState(enum.Enum):
    STARTING = "starting"  # registered, still loading weights or warming up: never routed to
    READY = "ready"  # healthy and accepting requests
    DRAINING = "draining"  # finishing in-flight requests before removal: never routed to
    EJECTED = "ejected"  # circuit open after failures: only half-open probes reach it


class RequestInfo(msgspec.Struct, frozen=True):
    """The parts of a request that routing needs. Every field may be absent.

    The value types here are frozen msgspec Structs: the proxy builds one of each per request,
    and a Struct is built in C (a frozen dataclass stores each field through
    object.__setattr__, several times dearer). `msgspec.structs.replace` makes a changed copy."""

    model: str | None = None
    prompt: str | None = None
    """The whole prompt as the engine will see it (chat messages rendered in order)."""
    prompt_token_ids: tuple[int, ...] | None = None
    """Token ids when the caller has them (the simulator does); preferred over `prompt`."""
    session_key: str | None = None
    """From the configured session header, else the body's `user` field."""
    lora: str | None = None
    """The LoRA adapter named by the request's `model`, if it is an adapter."""
    prompt_tokens: int = 0
    """Estimated prompt length in tokens (reserved against the chosen backend at pick time)."""
    max_tokens: int | None = None
    headers: Mapping[str, str] = msgspec.field(default_factory=dict)
    request_id: str | None = None


class BackendView(msgspec.Struct, frozen=True):
    """One backend as a policy sees it at decision time."""

    index: int
    """Position in the pool; ties break on the lowest index."""
    url: str
    state: BackendState = BackendState.READY
    weight: float = 1.0
    models: frozenset[str] = frozenset()
    """Base models and loaded LoRA adapters this backend serves."""
    in_flight: int = 0
    """Router-side outstanding requests, counted from pick time to the last byte."""
    in_flight_tokens: int = 0
    """Router-side reserved tokens (estimated prompt plus max tokens) of outstanding requests."""
    prefill_tokens: float = 0.0
    """Prefill tokens this backend has computed so far (prompt tokens minus cached tokens)."""
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    """Waiting requests (vLLM `num_requests_waiting`, llama.cpp `requests_deferred`)."""
    kv_cache_usage: float | None = None
    """KV-cache usage in [0, 1]."""
    cache_capacity_tokens: int | None = None
    """Prefix-cache capacity in tokens (KV blocks x block size), sizes approximate prefix indexes."""
    lora_adapters: frozenset[str] = frozenset()
    """Adapters running or waiting on the engine (newest `vllm:lora_requests_info` series)."""
    metrics: Mapping[str, float] = msgspec.field(default_factory=dict)
    """Other scraped engine metrics by name, for `signal=<metric>`."""
    metrics_age_s: float | None = None
    """Age of the scraped metrics; None when never scraped."""


class Decision(msgspec.Struct, frozen=True):
    index: int
    """Index (BackendView.index) of the chosen backend."""
    rule: str
    """Short name of the rule that decided, e.g. `prefix-match` or `load-guard`."""
    predicted_cached_tokens: int | None = None
    """Prompt tokens the policy expects the chosen backend to serve from its prefix cache
    (policies with a prefix index); None when the policy makes no such prediction. Compared with
    what the engine reports, it shows how well the index tracks the engines' caches."""


class RoutingPolicy(abc.ABC):
    """Base class: subclasses set `name`, optionally `Config`, and implement `select`."""

    name: ClassVar[str] = ""
    Config: ClassVar[type | None] = None
    """Dataclass of the policy's parameters; `Config()` is used when no config is given."""

    def __init__(self, config: object | None = None, rng: random.Random | None = None) -> None:
        self.config = config if config is not None or self.Config is None else self.Config()
        self.rng = rng if rng is not None else random.Random(0)

    @abc.abstractmethod
    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        """Pick one of `backends` (already filtered to routable ones), or None if none fits."""

    def on_request_complete(  # noqa: B027 (an optional hook: a no-op unless overridden)
        self, backend: BackendView, request: RequestInfo, prompt_tokens: int = 0, cached_tokens: int = 0
    ) -> None:
        """Feedback after a request finished on `backend`; a no-op unless a policy learns from it."""

    def reset(self) -> None:  # noqa: B027 (an optional hook: a no-op unless overridden)
        """Forget learned state (backends changed wholesale)."""
