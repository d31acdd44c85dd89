"""`lora-affinity`: prefer backends that already run the requested LoRA adapter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.prefix_aware import imbalanced
from policies.routing.registry import register_policy
from policies.routing.signals import least_loaded, load_of
from policies.routing.validation import require_at_least, require_non_negative, require_signal


@dataclass(frozen=True)
class LoraAffinityConfig:
    signal: str = "in_flight"
    """Load signal for the bound and the fallback."""
    bound_abs: float = 8
    """The adapter's backend is passed over when its load exceeds the least load by more than
    this (AIBrix's imbalance count is 8)..."""
    bound_rel: float = 1.5
    """...and is also more than this x the least load."""

    def __post_init__(self) -> None:
        require_signal("signal", self.signal)
        require_non_negative("bound_abs", self.bound_abs)
        require_at_least("bound_rel", self.bound_rel, 1.0)


def requested_adapter(request: RequestInfo) -> str | None:
    """The adapter a request names: `RequestInfo.lora`."""
    return request.lora


@register_policy("lora-affinity", config=LoraAffinityConfig)
class LoraAffinity(RoutingPolicy):
    """Among backends whose running or waiting adapters include the request's adapter, the least
    loaded, unless it is too far above the least-loaded backend overall.

    An engine that already has the adapter in its batch serves it without loading it or waiting
    for a free adapter slot (vLLM's `max_loras`).
    Rules:
    - `no-adapter`: the request names no adapter: least `signal`;
    - `lora-affinity`: the least-loaded backend with the adapter is within the bound;
    - `load-guard`: it is beyond the bound (load - min > bound_abs AND load > bound_rel x min):
      least `signal` overall;
    - `no-affinity`: no backend has the adapter active: least `signal` among backends that
      list it in `models`, else among all.
    Ties go to the lowest index.
    """

    config: LoraAffinityConfig

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        signal = self.config.signal
        adapter = requested_adapter(request)
        if adapter is None:
            return Decision(least_loaded(backends, signal).index, "no-adapter")
        active = [b for b in backends if adapter in b.lora_adapters]
        if not active:
            serving = [b for b in backends if adapter in b.models] or list(backends)
            return Decision(least_loaded(serving, signal).index, "no-affinity")
        best = least_loaded(active, signal)
        lightest = least_loaded(backends, signal)
        pair = (load_of(best, signal), load_of(lightest, signal))
        if imbalanced(pair, self.config.bound_abs, self.config.bound_rel):
            return Decision(lightest.index, "load-guard")
        return Decision(best.index, "lora-affinity")
