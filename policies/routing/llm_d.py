"""`llm-d`: the llm-d inference scheduler's default scorer set, the Gateway API inference extension's EPP.

Source: llm-d/llm-d-inference-scheduler at 520af47 (2026-05-17; Go module llm-d-router, which now
holds the GIE endpoint picker): `pkg/epp/config/loader/defaults.go` (queue-scorer weight 2,
kv-cache-utilization-scorer 2, prefix-cache-scorer 3, max-score picker), the scorers under
`pkg/epp/framework/plugins/scheduling/scorer/`, and the approximate prefix data producer
(`requestcontrol/dataproducer/approximateprefix`: 16-token blocks of 4 characters each, at most
256 blocks, an LRU of 31 250 blocks per server or the engine's own block count).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.hash_ring import stable_hash
from policies.routing.registry import register_policy
from policies.routing.signals import load_of
from policies.routing.validation import require_non_negative, require_positive


@dataclass(frozen=True)
class LlmDConfig:
    queue_weight: float = 2.0
    """Weight of the queue scorer: (max waiting - waiting) / (max - min), 1 when all are equal."""
    kv_cache_weight: float = 2.0
    """Weight of the KV-cache utilisation scorer: 1 - KV usage."""
    prefix_weight: float = 3.0
    """Weight of the prefix-cache scorer: matched blocks / the request's blocks."""
    block_size_tokens: int = 16
    """Tokens per block (vLLM's default)."""
    chars_per_token: int = 4
    """Characters per token when the prompt is text (llm-d's averageCharactersPerToken)."""
    max_prefix_blocks: int = 256
    """Blocks of the prompt hashed; a longer prompt is cut there."""
    lru_capacity_blocks: int = 31_250
    """Blocks remembered per backend that reports no cache capacity."""

    def __post_init__(self) -> None:
        for name in ("queue_weight", "kv_cache_weight", "prefix_weight"):
            require_non_negative(name, getattr(self, name))
        for name in ("block_size_tokens", "chars_per_token", "max_prefix_blocks", "lru_capacity_blocks"):
            require_positive(name, getattr(self, name))


def llm_d_hashes(request: RequestInfo, cfg: LlmDConfig) -> list[int]:
    """Chained block hashes as llm-d cuts prompts: fixed blocks from the start, the trailing
    partial block included, at most max_prefix_blocks; the chain starts from the model name."""
    if request.prompt_token_ids:
        seq: Sequence[object] = tuple(request.prompt_token_ids)
        size = cfg.block_size_tokens
    else:
        seq, size = request.prompt or "", cfg.block_size_tokens * cfg.chars_per_token
    seq = seq[: size * cfg.max_prefix_blocks]
    previous, hashes = stable_hash(request.model or ""), []
    for i in range(0, len(seq), size):
        previous = hash((previous, seq[i : i + size]))
        hashes.append(previous)
    return hashes


class ServerLRU:
    """llm-d's approximate indexer: per server an LRU of block hashes (oldest first), plus which
    servers hold each hash."""

    def __init__(self) -> None:
        self.lru: dict[str, OrderedDict[int, None]] = {}
        self.holders: dict[int, set[str]] = {}

    def add(self, hashes: Sequence[int], server: str, capacity: int) -> None:
        held = self.lru.setdefault(server, OrderedDict())
        for h in hashes:  # in prompt order, as llm-d adds them: the first block is evicted first
            held[h] = None
            held.move_to_end(h)
            self.holders.setdefault(h, set()).add(server)
            if len(held) > capacity:
                old, _ = held.popitem(last=False)
                self.holders[old].discard(server)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per server, blocks held along the prefix that some server holds (llm-d's greedy walk)."""
        counts: dict[str, int] = {}
        for h in hashes:
            servers = self.holders.get(h)
            if not servers:
                break
            for s in servers:
                counts[s] = counts.get(s, 0) + 1
        return counts


@register_policy("llm-d", config=LlmDConfig)
class LlmD(RoutingPolicy):
    """llm-d's default endpoint picker: the highest weighted sum of three scorers, each in [0, 1].

        score = 2 x queue + 2 x kv-cache + 3 x prefix

    queue: (max - waiting) / (max - min) over the offered backends, 1 when all wait equally
    (`waiting`: the scraped `vllm:num_requests_waiting` plus what the router sent since, the
    router's in-flight count before the first scrape). kv-cache: 1 - `kv_cache_usage` (0 when never
    scraped). prefix: the request's blocks the backend holds / its blocks (0 for an empty prompt),
    from an index of this policy's own decisions, as llm-d's default approximate scorer keeps one
    (the precise, event-fed scorer is not in the default set; see `precise-prefix`).
    Picker: the maximum score, ties broken at random (llm-d shuffles, then sorts stably); here
    from the policy's seeded rng. Rules: `prefix-match` when the winner holds part of the
    prompt, else `least-load`. Differences: llm-d hashes the JSON of chat messages, Flotilla the
    rendered prompt; inactive servers leave llm-d's index after 2 minutes, here on `reset`.
    """

    config: LlmDConfig

    def __init__(self, config: object | None = None, rng: random.Random | None = None) -> None:
        super().__init__(config, rng)
        self.index = ServerLRU()

    def scores(self, backends: Sequence[BackendView], hashes: Sequence[int]) -> list[tuple[float, float]]:
        """Per backend, in order: (weighted score, prefix score)."""
        cfg = self.config
        waiting = [load_of(b, "waiting") for b in backends]
        high, low = max(waiting), min(waiting)
        matched = self.index.match(hashes)
        out = []
        for b, q in zip(backends, waiting, strict=True):
            queue = 1.0 if high == low else (high - q) / (high - low)
            kv = 1.0 - (b.kv_cache_usage or 0.0)
            prefix = matched.get(b.url, 0) / len(hashes) if hashes else 0.0
            out.append((cfg.queue_weight * queue + cfg.kv_cache_weight * kv + cfg.prefix_weight * prefix, prefix))
        return out

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        cfg = self.config
        hashes = llm_d_hashes(request, cfg)
        scores = self.scores(backends, hashes)
        best = max(s for s, _ in scores)
        winner_at = self.rng.choice([i for i, (s, _) in enumerate(scores) if s == best])
        winner, prefix = backends[winner_at], scores[winner_at][1]
        capacity = (cfg.lru_capacity_blocks if winner.cache_capacity_tokens is None
                    else max(1, winner.cache_capacity_tokens // cfg.block_size_tokens))
        predicted = round(prefix * len(hashes)) * cfg.block_size_tokens
        self.index.add(hashes, winner.url, capacity)
        return Decision(winner.index, "prefix-match" if prefix > 0 else "least-load", predicted)

    def reset(self) -> None:
        self.index = ServerLRU()
