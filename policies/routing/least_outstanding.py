"""`least-outstanding`: the backend with the fewest requests this router has in flight."""

from __future__ import annotations

from collections.abc import Sequence

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.registry import EmptyConfig, register_policy
from policies.routing.signals import least_loaded


@register_policy("least-outstanding", config=EmptyConfig)
class LeastOutstanding(RoutingPolicy):
    """Pick the least `BackendView.in_flight` (router-side, counted from pick time to last byte).

    Rule: `least-outstanding`; ties go to the lowest index. No parameters. Because the count is
    the router's own, it is never stale: a burst spreads even before any scrape.
    """

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        return Decision(least_loaded(backends, "in_flight").index, "least-outstanding")
