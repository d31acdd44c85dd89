"""Asks the routing policy for a backend, over a fresh snapshot of the routable ones."""

from __future__ import annotations

from collections.abc import Collection

from policies.routing.base import Decision, RequestInfo, RoutingPolicy
from proxy.metrics import RouterMetrics
from proxy.pool import Backend, BackendPool


class Router:
    def __init__(self, pool: BackendPool, policy: RoutingPolicy, policy_name: str,
                 metrics: RouterMetrics) -> None:
        self.pool = pool
        self.policy = policy
        self.policy_name = policy_name
        self.metrics = metrics
        self._generation = pool.generation
        # Building a view per finished request costs time; skip it for policies that ignore feedback.
        self.wants_feedback = type(policy).on_request_complete is not RoutingPolicy.on_request_complete

    def pick(self, info: RequestInfo, now_s: float,
             exclude: Collection[Backend] = ()) -> tuple[Backend, Decision] | None:
        """The policy's choice among routable backends not in `exclude`, or None if none fits."""
        if self.pool.generation != self._generation:
            # Backends left, so positions moved: state a policy keeps by index is stale.
            self.policy.reset()
            self._generation = self.pool.generation
        backends = self.pool.backends
        views = self.pool.views(now_s, info.model)
        if exclude:
            views = [v for v in views if backends[v.index] not in exclude]
        if not views:
            return None
        decision = self.policy.select(views, info)
        if decision is None:
            return None
        self.metrics.decision(self.policy_name, decision.rule)
        return backends[decision.index], decision

    def feedback(self, backend: Backend, info: RequestInfo, now_s: float, prompt_tokens: int,
                 cached_tokens: int) -> None:
        """Tell the policy a request finished (learning policies track cache reuse from it)."""
        if not self.wants_feedback or backend not in self.pool.backends:
            return
        view = backend.view(self.pool.backends.index(backend), now_s)
        self.policy.on_request_complete(view, info, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens)
