"""`weighted`: a weighted sum of scorers, like the Gateway API Inference Extension's endpoint picker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo
from policies.routing.prefix_aware import imbalanced
from policies.routing.prefix_index import block_hashes
from policies.routing.prefix_indexed import PrefixIndexedPolicy
from policies.routing.registry import ConfigError, register_policy
from policies.routing.signals import load_of
from policies.routing.validation import (
    require_at_least,
    require_non_negative,
    require_positive,
    require_signal,
)

SCORERS = ("queue", "kv-cache", "prefix-match", "lora")


@dataclass(frozen=True)
class WeightedConfig:
    queue: float = 2.0
    """Weight of the queue scorer (endpoint picker default 2)."""
    kv: float = 2.0
    """Weight of the KV-cache scorer (endpoint picker default 2)."""
    prefix: float = 3.0
    """Weight of the prefix-match scorer (endpoint picker default 3)."""
    lora: float = 1.0
    """Weight of the LoRA scorer (not in the endpoint picker's default profile)."""
    queue_signal: str = "in_flight"
    """Load signal of the queue scorer. The picker reads the engine's waiting count; the
    router's in-flight count is the default here because it never lags a burst."""
    affinity_abs: float = 4.0
    """A backend whose queue load exceeds the least load by more than this..."""
    affinity_rel: float = 1.25
    """...and is above this x the least load scores 0 on prefix and LoRA."""
    block_size_tokens: int = 16
    """Tokens per hashed prompt block."""
    chars_per_token: int = 4
    """Characters per token when the prompt is text only."""
    default_capacity_tokens: int = 500_000
    """Prefix-index size for a backend that reports no cache capacity."""

    def __post_init__(self) -> None:
        for name in ("queue", "kv", "prefix", "lora", "affinity_abs"):
            require_non_negative(name, getattr(self, name))
        if self.queue + self.kv + self.prefix + self.lora <= 0:
            raise ConfigError("queue", self.queue, "at least one scorer weight must be > 0")
        require_signal("queue_signal", self.queue_signal)
        require_at_least("affinity_rel", self.affinity_rel, 1.0)
        require_positive("block_size_tokens", self.block_size_tokens)
        require_positive("chars_per_token", self.chars_per_token)
        require_positive("default_capacity_tokens", self.default_capacity_tokens)


@register_policy("weighted", config=WeightedConfig)
class Weighted(PrefixIndexedPolicy):
    """Pick the highest sum of weight x score; every score is in [0, 1].

    Scorers (the endpoint picker's formulas where it has one):
    - queue: (max q - q) / (max q - min q) over the offered backends, 1 when all are equal;
    - kv-cache: 1 - kv_cache_usage (an unscraped backend counts as empty);
    - prefix-match: share of the prompt's blocks the policy's own prefix index places there;
    - lora: 1 if the adapter is running or waiting there, 0.5 if only listed in `models`,
      0 otherwise; 1 everywhere for a request without an adapter.
    Prefix and LoRA score 0 on a backend whose load exceeds the least load by more than
    affinity_abs AND is above affinity_rel x the least load. Without this, a max-score picker
    whose prefix weight beats its queue weight sends a burst of one prompt to one pod (the
    endpoint picker's known hot spot); with it, affinity yields once its backend pulls ahead.
    Rule: the scorer that most favours the winner over the runner-up (`queue`, `kv-cache`,
    `prefix-match`, `lora`), or `tie` when the best totals are equal (lowest index wins).
    """

    config: WeightedConfig

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        hashes = block_hashes(request, self.shape)
        table = self.scores(backends, request, hashes)
        ranked = sorted(range(len(backends)), key=lambda i: (-_total(table[i]), backends[i].index))
        return self.decide(backends[ranked[0]], hashes, self._rule(table, ranked))

    def scores(
        self, backends: Sequence[BackendView], request: RequestInfo, hashes: list[int]
    ) -> list[dict[str, float]]:
        """Weighted score of every scorer, per backend, in the order of `backends`."""
        cfg = self.config
        loads = [load_of(b, cfg.queue_signal) for b in backends]
        high, low = max(loads), min(loads)
        table = []
        for backend, load in zip(backends, loads, strict=True):
            near = not imbalanced((load, low), cfg.affinity_abs, cfg.affinity_rel)
            queue = 1.0 if high == low else (high - load) / (high - low)
            table.append(
                {
                    "queue": cfg.queue * queue,
                    "kv-cache": cfg.kv * (1.0 - load_of(backend, "kv_cache_usage")),
                    "prefix-match": cfg.prefix * self.index.match_fraction(backend.url, hashes) if near else 0.0,
                    "lora": cfg.lora * _lora_score(backend, request) if near else 0.0,
                }
            )
        return table

    def _rule(self, table: list[dict[str, float]], ranked: list[int]) -> str:
        if len(ranked) == 1:
            return "queue"
        first, second = table[ranked[0]], table[ranked[1]]
        if _total(first) == _total(second):
            return "tie"
        return max(SCORERS, key=lambda s: first[s] - second[s])


def _lora_score(backend: BackendView, request: RequestInfo) -> float:
    if request.lora is None or request.lora in backend.lora_adapters:
        return 1.0
    return 0.5 if request.lora in backend.models else 0.0


def _total(scores: dict[str, float]) -> float:
    # Rounded so that float noise never overrides the lowest-index tie-break.
    return round(sum(scores.values()), 9)
