"""`dynamo-kv`: NVIDIA Dynamo's KV router cost, with its defaults.

Source: ai-dynamo/dynamo `DefaultWorkerSelector::select_worker` (lib/llm/src/kv_router/scheduler.rs,
later lib/kv-router/src/scheduling/selector.rs) and `KvRouterConfig::default()`
(overlap_score_weight 1.0, router_temperature 0.0), as in Dynamo 0.4-0.8 and the router docs
(docs/router/kv_cache_routing.md). Later versions (selector/default.rs at a4bdb9b) generalise the
overlap term (overlap_score_credit, prefill_load_scale, tiered caches); that is not followed here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo
from policies.routing.kv_index import KVIndexUser
from policies.routing.prefix_index import block_hashes
from policies.routing.prefix_indexed import PrefixIndexedPolicy
from policies.routing.registry import register_policy
from policies.routing.validation import require_non_negative, require_positive


@dataclass(frozen=True)
class DynamoKvConfig:
    overlap_score_weight: float = 1.0
    """Weight of the prefill blocks against the decode blocks (Dynamo's default 1.0)."""
    router_temperature: float = 0.0
    """0 picks the least cost; above 0, softmax sampling over min-max-scaled costs."""
    block_size_tokens: int = 16
    """Tokens per KV block (the engine's; vLLM's default 16)."""
    chars_per_token: int = 4
    """Approximate index only: characters per token when the prompt is text."""
    default_capacity_tokens: int = 500_000
    """Approximate index only: size for a backend that reports no cache capacity."""

    def __post_init__(self) -> None:
        require_non_negative("overlap_score_weight", self.overlap_score_weight)
        require_non_negative("router_temperature", self.router_temperature)
        require_positive("block_size_tokens", self.block_size_tokens)
        require_positive("chars_per_token", self.chars_per_token)
        require_positive("default_capacity_tokens", self.default_capacity_tokens)


@register_policy("dynamo-kv", config=DynamoKvConfig)
class DynamoKv(KVIndexUser, PrefixIndexedPolicy):
    """Dynamo's KV router: the least `overlap_score_weight x prefill_blocks + decode_blocks`.

    For each backend, with `overlap` the request's leading blocks cached there:
        prefill_blocks = (prompt tokens - overlap x block size) / block size
        decode_blocks  = blocks in hand there + (request blocks - overlap)
    Blocks in hand are the router's reservations (`in_flight_tokens`, prompt plus max tokens of
    the backend's in-flight requests) over the block size; Dynamo counts each distinct active
    block once. Cached blocks come from the engines' KV events where the proxy or the simulator
    binds a `KVIndex` and the backend publishes them (Dynamo's default, `--kv-events`); otherwise
    from an index of this policy's own decisions (Dynamo's `--no-kv-events` mode, which also
    expires entries after 120 s; this one is an LRU sized from the backend's cache capacity).
    Temperature 0 (default): the least cost; ties to the smaller index tree (fewer cached blocks
    known for the backend), then the lower index (Dynamo: hash-map order). Above 0: one backend
    sampled with probability softmax(-cost / (max - min) / temperature), from the seeded rng.
    Differences: Dynamo also adds the prefill tokens of requests not yet past prefill on the
    backend (the router learns when their first token leaves); a policy here does not see first
    tokens, so that term is 0. Rules: `prefix-match` when the winner holds part of the prompt,
    else `least-load`. `prefix-cost` is not an alias: it weighs uncached blocks 8:1 against
    blocks in hand by default and breaks ties on load.
    """

    config: DynamoKvConfig

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        cfg = self.config
        overlaps, hashes = self._overlaps(backends, request)
        tokens = request.prompt_tokens or len(request.prompt_token_ids or ()) or len(hashes) * cfg.block_size_tokens
        request_blocks = math.ceil(tokens / cfg.block_size_tokens)
        costs = []
        for b in backends:
            overlap = overlaps[b.index]
            prefill_blocks = max(0, tokens - overlap * cfg.block_size_tokens) / cfg.block_size_tokens
            decode_blocks = b.in_flight_tokens / cfg.block_size_tokens + max(0, request_blocks - overlap)
            costs.append(cfg.overlap_score_weight * prefill_blocks + decode_blocks)
        winner = backends[self._pick(backends, costs)]
        if winner.index in hashes:
            self.index.record(winner, hashes[winner.index], cfg.block_size_tokens)
        overlap = overlaps[winner.index]
        return Decision(winner.index, "prefix-match" if overlap else "least-load", overlap * cfg.block_size_tokens)

    def _pick(self, backends: Sequence[BackendView], costs: list[float]) -> int:
        if self.config.router_temperature == 0:
            low = min(costs)
            tied = [i for i, c in enumerate(costs) if abs(c - low) < 1e-5]  # Dynamo's epsilon
            return min(tied, key=lambda i: (self._tree_size(backends[i]), backends[i].index))
        high, low = max(costs), min(costs)
        if high == low:
            return self.rng.randrange(len(costs))
        scaled = [-c / (high - low) / self.config.router_temperature for c in costs]
        top = max(scaled)
        weights = [math.exp(s - top) for s in scaled]
        return self.rng.choices(range(len(costs)), weights=weights)[0]

    def _tree_size(self, backend: BackendView) -> int:
        index = self.kv_index
        if index is not None and index.tracks(backend.url):
            return index.size(backend.url)
        return self.index.size(backend.url)

    def _overlaps(self, backends: Sequence[BackendView],
                  request: RequestInfo) -> tuple[dict[int, int], dict[int, list[int]]]:
        """Per backend index, cached leading blocks; and, for backends without events, the
        request's approximate block hashes (recorded there if chosen)."""
        cfg, index = self.config, self.kv_index
        precise: dict[str, int] = {}
        if index is not None and request.prompt_token_ids:
            precise = index.prefix_tokens(request.prompt_token_ids, request.lora, (b.url for b in backends))
        overlaps: dict[int, int] = {}
        approx: dict[int, list[int]] = {}
        hashes: list[int] | None = None
        for b in backends:
            if index is not None and index.tracks(b.url):
                overlaps[b.index] = precise.get(b.url, 0) // cfg.block_size_tokens
                continue
            if hashes is None:
                hashes = block_hashes(request, self.shape)
            approx[b.index] = hashes
            overlaps[b.index] = self.index.match(b.url, hashes)
        return overlaps, approx
