"""`aibrix-prefix`: AIBrix's gateway `prefix-cache` routing algorithm, with its defaults.

Source: vllm-project/aibrix at e3e10f9 (v0.7.0-156), `pkg/plugins/gateway/algorithms/
prefix_cache.go` (`routeOriginal`, without KV-event sync, its default), `least_request.go`,
`pkg/utils/prefixcacheindexer/hash.go`: character tokenizer, blocks of 4 tokens, one shared LRU
of 200 000 blocks, imbalance when max - min running requests > 8, match accepted on a backend
with at most mean + 1 standard deviation of running requests.
"""

from __future__ import annotations

import random
import statistics
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.registry import register_policy
from policies.routing.validation import require_non_negative, require_positive


@dataclass(frozen=True)
class AibrixPrefixConfig:
    block_size: int = 4
    """Tokens per hashed block (AIBRIX_PREFIX_CACHE_BLOCK_SIZE): characters (UTF-8 bytes) of the
    text with AIBrix's default character tokenizer, token ids when the request has them."""
    block_number: int = 200_000
    """Blocks the shared index holds (AIBRIX_PREFIX_CACHE_BLOCK_NUMBER), least recent out first."""
    imbalance_abs_count: int = 8
    """Imbalanced when max - min running requests exceeds this: only the least loaded compete."""
    standard_deviation_factor: int = 1
    """A matched backend is taken only with at most mean + this x stddev running requests."""

    def __post_init__(self) -> None:
        require_positive("block_size", self.block_size)
        require_positive("block_number", self.block_number)
        require_non_negative("imbalance_abs_count", self.imbalance_abs_count)
        require_non_negative("standard_deviation_factor", self.standard_deviation_factor)


def aibrix_hashes(request: RequestInfo, block_size: int) -> list[int]:
    """Chained hashes of full blocks (AIBrix drops the incomplete tail)."""
    seq: Sequence[object] = (tuple(request.prompt_token_ids) if request.prompt_token_ids
                             else (request.prompt or "").encode())
    previous, hashes = 0, []
    for i in range(0, len(seq) - block_size + 1, block_size):
        previous = hash((previous, seq[i : i + block_size]))
        hashes.append(previous)
    return hashes


@register_policy("aibrix-prefix", config=AibrixPrefixConfig)
class AibrixPrefix(RoutingPolicy):
    """AIBrix `prefix-cache`: the longest matched prefix on a backend not far above mean load.

    Load is running requests, the router's in-flight count (AIBrix's gateway-side count).
    1. If max - min > imbalance_abs_count, only the least loaded backends are matched against.
    2. Match: walk the request's blocks through the shared index; each candidate holding block
       i is credited (i + 1) x 100 // blocks percent; the walk stops at the first block no
       candidate holds.
    3. Among matched backends, by percent (high first), then load (low first), random among
       equals (AIBrix shuffles, then sorts stably), the first whose load is at most
       mean + standard_deviation_factor x sample stddev over all backends: `prefix-match`.
    4. Otherwise the least loaded, random among equals: `least-load`.
    The chosen backend is then recorded as holding every block of the request, per model.
    Differences: the index's idle expiry (20 minutes, checked every second) needs a clock and is
    not kept; the capacity LRU is. Random choices come from the policy's seeded rng.
    """

    config: AibrixPrefixConfig

    def __init__(self, config: object | None = None, rng: random.Random | None = None) -> None:
        super().__init__(config, rng)
        self.blocks: OrderedDict[int, dict[str, set[str]]] = OrderedDict()
        """Block hash -> model -> backend URLs holding it; least recently used first."""

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        cfg, model = self.config, request.model or ""
        loads = [b.in_flight for b in backends]
        candidates = list(backends)
        if max(loads) - min(loads) > cfg.imbalance_abs_count:
            candidates = [b for b, load in zip(backends, loads, strict=True) if load == min(loads)]
        hashes = aibrix_hashes(request, cfg.block_size)
        matched = self._match(hashes, model, {b.url for b in candidates})
        winner = self._matched_winner(backends, loads, matched) if matched else None
        rule = "prefix-match"
        if winner is None:
            least = min(loads)
            winner, rule = self.rng.choice([b for b, load in zip(backends, loads, strict=True) if load == least]), "least-load"
        predicted = matched.get(winner.url, 0) * len(hashes) // 100 * cfg.block_size if request.prompt_token_ids else None
        self._add(hashes, model, winner.url)
        return Decision(winner.index, rule, predicted)

    def _match(self, hashes: Sequence[int], model: str, ready: set[str]) -> dict[str, int]:
        percent: dict[str, int] = {}
        for i, h in enumerate(hashes):
            holders = self.blocks.get(h, {}).get(model, set()) & ready
            if not holders:
                break
            self.blocks.move_to_end(h)  # a lookup refreshes the entry, as AIBrix's LRU store's Get does
            for url in holders:
                percent[url] = (i + 1) * 100 // len(hashes)
        return percent

    def _matched_winner(self, backends: Sequence[BackendView], loads: list[int],
                        matched: dict[str, int]) -> BackendView | None:
        bound = statistics.mean(loads) + self.config.standard_deviation_factor * (
            statistics.stdev(loads) if len(loads) > 1 else 0.0)
        by_url = {b.url: (b, load) for b, load in zip(backends, loads, strict=True)}
        urls = [u for u in matched if u in by_url]
        self.rng.shuffle(urls)
        urls.sort(key=lambda u: (-matched[u], by_url[u][1]))
        return next((by_url[u][0] for u in urls if by_url[u][1] <= bound), None)

    def _add(self, hashes: Sequence[int], model: str, url: str) -> None:
        for h in hashes:
            self.blocks.setdefault(h, {}).setdefault(model, set()).add(url)
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.config.block_number:
            self.blocks.popitem(last=False)

    def reset(self) -> None:
        self.blocks.clear()
