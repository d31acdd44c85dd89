"""`prefix-capacity`: prefix-cost over each backend's capacity, with the work it is owed counted off."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo
from policies.routing.prefix_cost import PrefixCost, PrefixCostConfig
from policies.routing.prefix_index import block_hashes
from policies.routing.registry import register_policy
from policies.routing.validation import require_non_negative


@dataclass(frozen=True)
class PrefixCapacityConfig(PrefixCostConfig):
    horizon: int = 1000
    """Requests over which a backend's unmet share is remembered: every decision forgets
    1/horizon of it. 0 drops the share term (prefix-cost over capacity alone)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_non_negative("horizon", self.horizon)


@register_policy("prefix-capacity", config=PrefixCapacityConfig)
class PrefixCapacity(PrefixCost):
    """prefix-cost with every backend weighed by what it can do (`BackendView.weight`).

        cost = (overlap_weight x prompt blocks to prefill + blocks in hand - blocks owed) / weight

    The first two terms are prefix-cost's, in KV blocks. Dividing by the weight (relative to the
    offered backends' mean) turns work into time: a backend of twice the capacity prefills and
    drains its queue twice as fast.
    Blocks owed are each backend's unmet share of the work routed so far: every decision credits
    every offered backend with its weight's share of the request's reserved blocks and debits
    the winner the whole request. Owed work counts as negative work in hand, so an idle fleet,
    where every load reads 0, spreads in proportion to capacity instead of handing every request
    to the backend that holds the shared system prompt or has the lowest index. A shared prompt
    moves once a backend is owed more than the one prefill it costs elsewhere; a session's long
    context keeps it at home until far more is owed. Each decision forgets 1/horizon of what is
    owed, so a backend slower than its weight says is not fed its share for ever.
    Ties go to the backend owed more, then the lower index. Rules: `prefix-match` when the
    winner holds part of the prompt, else `least-load`.
    """

    config: PrefixCapacityConfig

    def __init__(self, config: object | None = None, rng: random.Random | None = None) -> None:
        super().__init__(config, rng)
        self.owed: dict[str, float] = {}
        """Blocks each backend (by URL) is owed against its share; negative when ahead of it."""

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        hashes = block_hashes(request, self.shape)
        blocks = max(1, request.prompt_tokens + (request.max_tokens or 0)) / self.config.block_size_tokens
        owed = self._share(backends, blocks)
        costs = self.costs(backends, hashes)
        mean_weight = sum(_weight(b) for b in backends) / len(backends)
        best = min(range(len(backends)), key=lambda i: (
            (costs[i][0] - owed[i]) * mean_weight / _weight(backends[i]), -owed[i], backends[i].index))
        if self.config.horizon:
            self.owed[backends[best].url] -= blocks
        return self.decide(backends[best], hashes, "prefix-match" if costs[best][2] < len(hashes) else "least-load")

    def _share(self, backends: Sequence[BackendView], blocks: float) -> list[float]:
        """Credit every offered backend its share of `blocks`; the owed blocks, in order.

        What the offered backends are owed is kept summing to zero, so one that joins starts
        even and one that leaves takes nothing with it."""
        if not self.config.horizon:
            return [0.0] * len(backends)
        total = sum(_weight(b) for b in backends)
        held = [self.owed.get(b.url, 0.0) for b in backends]
        drift = sum(held) / len(held)
        keep = 1.0 - 1.0 / self.config.horizon
        for b, owed in zip(backends, held, strict=True):
            self.owed[b.url] = (owed - drift) * keep + blocks * _weight(b) / total
        return [self.owed[b.url] for b in backends]

    def reset(self) -> None:
        super().reset()
        self.owed.clear()


def _weight(backend: BackendView) -> float:
    # BackendSpec refuses weights <= 0; a view built by hand may still carry one
    return backend.weight if backend.weight > 0 else 1.0
