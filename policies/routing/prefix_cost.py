"""`prefix-cost`: send a request where it adds the least work, its uncached prefill plus the load there."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo
from policies.routing.prefix_index import block_hashes
from policies.routing.prefix_indexed import PrefixIndexedPolicy
from policies.routing.registry import register_policy
from policies.routing.validation import require_non_negative, require_positive


@dataclass(frozen=True)
class PrefixCostConfig:
    overlap_weight: float = 8.0
    """Weight of a block to prefill against a block in hand; 0 routes on load alone. Dynamo
    weighs them 1:1, but it counts each distinct active block once, where the reservations
    here count a shared prompt once per request; 8 kept hit rates within 2 points of
    session-affinity in the simulator's agent workloads (docs/routing-policies.md)."""
    block_size_tokens: int = 16
    """Tokens per hashed block (vLLM's KV block size)."""
    chars_per_token: int = 4
    """Characters per token when the prompt is text only."""
    default_capacity_tokens: int = 500_000
    """Index size for a backend that reports no `cache_capacity_tokens`."""

    def __post_init__(self) -> None:
        require_non_negative("overlap_weight", self.overlap_weight)
        require_positive("block_size_tokens", self.block_size_tokens)
        require_positive("chars_per_token", self.chars_per_token)
        require_positive("default_capacity_tokens", self.default_capacity_tokens)


@register_policy("prefix-cost", config=PrefixCostConfig)
class PrefixCost(PrefixIndexedPolicy):
    """Route to the least cost, in KV blocks, as NVIDIA Dynamo's KV router does:

        cost = overlap_weight x (prompt blocks not cached there) + blocks in hand there

    Blocks in hand are the router's reservations on the backend (prompt plus max tokens of its
    in-flight requests, `in_flight_tokens`) over block_size_tokens. Cached blocks come from the
    policy's own prefix index, which learns from its decisions as prefix-aware's does. Unlike a
    match threshold with a load guard, the cost weighs a cache hit against queued work in one
    unit, so a system prompt shared by every session is worth only its own prefill: sessions
    spread as soon as one backend holds more work than recomputing that prompt would cost.
    Ties go to fewer blocks in hand, then the lower index.
    Rules: `prefix-match` when the winner holds part of the prompt, else `least-load`.
    """

    config: PrefixCostConfig

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        hashes = block_hashes(request, self.shape)
        costs = self.costs(backends, hashes)
        best = min(range(len(backends)), key=lambda i: (costs[i][0], costs[i][1], backends[i].index))
        matched = len(hashes) - costs[best][2]
        return self.decide(backends[best], hashes, "prefix-match" if matched > 0 else "least-load")

    def costs(self, backends: Sequence[BackendView], hashes: list[int]) -> list[tuple[float, float, int]]:
        """Per backend, in order: (cost, blocks in hand, prompt blocks to prefill)."""
        cfg = self.config
        out = []
        for backend in backends:
            to_prefill = len(hashes) - self.index.match(backend.url, hashes)
            in_hand = backend.in_flight_tokens / cfg.block_size_tokens
            out.append((cfg.overlap_weight * to_prefill + in_hand, in_hand, to_prefill))
        return out
