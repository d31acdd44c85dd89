"""`sglang-cache-aware`: SGLang's model gateway `cache_aware` policy, as its 0.3.2 release has it.

Source: sgl-model-gateway 0.3.2 (`sglang-router` 0.3.2 on PyPI), `src/policies/cache_aware.rs`
and `tree.rs` at lightseekorg/smg c7f9bf9 ("[smg] release 0.3.2", sglang PR #17168), defaults
from its `router_args.py`. vllm-router's `cache_aware` is derived from the same code.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.radix_tree import RadixTree, Text
from policies.routing.registry import register_policy
from policies.routing.validation import require_at_least, require_fraction, require_non_negative


@dataclass(frozen=True)
class SglangCacheAwareConfig:
    cache_threshold: float = 0.3
    """Share of the request's text the tree must hold, in [0, 1], to follow the match."""
    balance_abs_threshold: int = 64
    """Imbalanced when max - min load exceeds this (requests in flight)..."""
    balance_rel_threshold: float = 1.5
    """...and max load exceeds this x min load."""
    max_tree_size: int = 2**26
    """Elements (characters, or token ids) each worker may hold in the tree after eviction."""
    eviction_interval_decisions: int = 600
    """Decisions between evictions; 0 never evicts. SGLang evicts on a timer thread every
    `eviction_interval_secs` (60 s); a policy reads no clock, so here eviction counts decisions
    (600 is 60 s at 10 requests/s)."""

    def __post_init__(self) -> None:
        require_fraction("cache_threshold", self.cache_threshold)
        require_non_negative("balance_abs_threshold", self.balance_abs_threshold)
        require_at_least("balance_rel_threshold", self.balance_rel_threshold, 0.0)
        require_non_negative("max_tree_size", self.max_tree_size)
        require_non_negative("eviction_interval_decisions", self.eviction_interval_decisions)


def request_text(request: RequestInfo) -> Text:
    """What the tree is keyed by: the prompt text (SGLang's), else the token ids (the simulator's)."""
    if request.prompt:
        return request.prompt
    return tuple(request.prompt_token_ids or ())


@register_policy("sglang-cache-aware", config=SglangCacheAwareConfig)
class SglangCacheAware(RoutingPolicy):
    """SGLang's `cache_aware`: the longest text match while loads are balanced, else the shortest queue.

    Load is the router's in-flight count (SGLang's worker load counter). Rules, in order:
    - `load-guard`: max - min > balance_abs_threshold AND max > balance_rel_threshold x min:
      the least loaded backend;
    - `prefix-match`: the tree holds more than cache_threshold of the request's text: the tenant
      of the deepest node matched (the backend that first sent that text there), whatever its load;
    - `least-load`: otherwise the least loaded backend.
    Ties go to the first backend offered (SGLang: the first in its worker list). Every decision
    inserts the request's text for the chosen backend into the tree of its model.
    Differences from SGLang: the text is `RequestInfo.prompt` (the proxy renders chat messages in
    order; SGLang joins their contents with spaces), else the token ids; eviction counts decisions
    instead of seconds; a matched tenant that is not offered (a retry's excluded backend) keeps its
    tree entries (SGLang drops a worker it cannot find), and, as in SGLang, the first backend offered
    is chosen (rule `stale-tenant`).
    """

    config: SglangCacheAwareConfig

    def __init__(self, config: object | None = None, rng: random.Random | None = None) -> None:
        super().__init__(config, rng)
        self.trees: dict[str, RadixTree] = {}
        self._decisions = 0

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        tree = self.trees.setdefault(request.model or "", RadixTree())
        text = request_text(request)
        decision = self._decide(backends, tree, text)
        if decision.rule != "stale-tenant":
            tree.insert(text, next(b.url for b in backends if b.index == decision.index))
        self._tick()
        return decision

    def _decide(self, backends: Sequence[BackendView], tree: RadixTree, text: Text) -> Decision:
        cfg = self.config
        loads = [b.in_flight for b in backends]
        high, low = max(loads), min(loads)
        least = backends[loads.index(low)]
        if high - low > cfg.balance_abs_threshold and high > low * cfg.balance_rel_threshold:
            return Decision(least.index, "load-guard")
        match = tree.prefix_match(text)
        rate = match.matched / match.total if match.total else 0.0
        if rate <= cfg.cache_threshold:
            return Decision(least.index, "least-load")
        owner = next((b for b in backends if b.url == match.tenant), None)
        if owner is None:
            return Decision(backends[0].index, "stale-tenant")
        cached = match.matched if not isinstance(text, str) else None  # token ids: tokens matched
        return Decision(owner.index, "prefix-match", cached)

    def _tick(self) -> None:
        interval = self.config.eviction_interval_decisions
        self._decisions += 1
        if interval and self._decisions % interval == 0:
            for tree in self.trees.values():
                tree.evict(self.config.max_tree_size)

    def reset(self) -> None:
        self.trees.clear()
        self._decisions = 0
