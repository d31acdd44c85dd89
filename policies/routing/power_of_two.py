"""`power-of-two`: two random candidates, the less loaded wins."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.registry import register_policy
from policies.routing.signals import least_loaded
from policies.routing.validation import require_signal


@dataclass(frozen=True)
class PowerOfTwoConfig:
    signal: str = "in_flight"
    """Load signal compared between the two candidates (see `least-load`)."""

    def __post_init__(self) -> None:
        require_signal("signal", self.signal)


@register_policy("power-of-two", config=PowerOfTwoConfig)
class PowerOfTwo(RoutingPolicy):
    """Draw two distinct backends from the injected rng; the one with less `signal` wins.

    Rule: `power-of-two`; between equal candidates the lower index wins. With one backend it is
    chosen without drawing. Parameter `signal` (default `in_flight`).
    """

    config: PowerOfTwoConfig

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        if len(backends) == 1:
            return Decision(backends[0].index, "power-of-two")
        first, second = self.rng.sample(range(len(backends)), 2)
        pair = (backends[first], backends[second])
        return Decision(least_loaded(pair, self.config.signal).index, "power-of-two")
