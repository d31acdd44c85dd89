"""`least-load`: the least value of a chosen load signal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.registry import register_policy
from policies.routing.signals import least_loaded
from policies.routing.validation import require_signal


@dataclass(frozen=True)
class LeastLoadConfig:
    signal: str = "in_flight"
    """Load signal to minimise: in_flight, in_flight_tokens, prefill_tokens, waiting, running,
    kv_cache_usage, or an engine metric name such as `vllm:num_requests_waiting`."""

    def __post_init__(self) -> None:
        require_signal("signal", self.signal)


@register_policy("least-load", config=LeastLoadConfig)
class LeastLoad(RoutingPolicy):
    """Pick the backend with the least `signal` (see `signals.load_of`).

    Rule: `least-load`; ties go to the lowest index. Parameter `signal` (default `in_flight`).
    """

    config: LeastLoadConfig

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        return Decision(least_loaded(backends, self.config.signal).index, "least-load")
