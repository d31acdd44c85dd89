"""`round-robin`: backends take turns."""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.registry import EmptyConfig, register_policy


@register_policy("round-robin", config=EmptyConfig)
class RoundRobin(RoutingPolicy):
    """Request n goes to backend n mod (number of backends offered).

    Rule: `round-robin`. No parameters. The counter counts requests, not backends, so when the
    pool shrinks the rotation carries on over the backends that remain.
    """

    def __init__(self, config: object | None = None, rng: random.Random | None = None) -> None:
        super().__init__(config, rng)
        self._count = 0  # requests placed so far

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        chosen = backends[self._count % len(backends)]
        self._count += 1
        return Decision(chosen.index, "round-robin")

    def reset(self) -> None:
        self._count = 0
