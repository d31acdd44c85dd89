"""`prefix-aware`: send a prompt where its prefix is cached, unless the fleet is out of balance."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo
from policies.routing.prefix_index import block_hashes
from policies.routing.prefix_indexed import PrefixIndexedPolicy
from policies.routing.registry import register_policy
from policies.routing.signals import least_loaded, load_of
from policies.routing.validation import (
    require_at_least,
    require_fraction,
    require_non_negative,
    require_positive,
    require_signal,
)


@dataclass(frozen=True)
class PrefixAwareConfig:
    cache_threshold: float = 0.3
    """Share of the prompt's blocks in [0, 1] the best match must exceed to win (SGLang 0.3)."""
    balance_abs_threshold: float = 64
    """Imbalance in `signal` units (max - min) beyond which cache affinity yields (SGLang 64)."""
    balance_rel_threshold: float = 1.5
    """...and max > this x min as well (SGLang 1.5)."""
    signal: str = "in_flight"
    """Load signal for the guard and for the least-loaded fallback."""
    block_size_tokens: int = 16
    """Tokens per hashed block (vLLM's KV block size)."""
    chars_per_token: int = 4
    """Characters per token when the prompt is text only."""
    default_capacity_tokens: int = 500_000
    """Index size for a backend that reports no `cache_capacity_tokens` (GIE: 31 250 blocks
    of 16 tokens)."""

    def __post_init__(self) -> None:
        require_fraction("cache_threshold", self.cache_threshold)
        require_non_negative("balance_abs_threshold", self.balance_abs_threshold)
        require_at_least("balance_rel_threshold", self.balance_rel_threshold, 1.0)
        require_signal("signal", self.signal)
        require_positive("block_size_tokens", self.block_size_tokens)
        require_positive("chars_per_token", self.chars_per_token)
        require_positive("default_capacity_tokens", self.default_capacity_tokens)


def imbalanced(loads: Sequence[float], abs_threshold: float, rel_threshold: float) -> bool:
    """SGLang's test: (max - min) > abs AND max > rel x min."""
    high, low = max(loads), min(loads)
    return high - low > abs_threshold and high > rel_threshold * low


@register_policy("prefix-aware", config=PrefixAwareConfig)
class PrefixAware(PrefixIndexedPolicy):
    """Route to the backend holding the longest cached prefix of the whole prompt.

    The prompt is what the engine sees: `RequestInfo.prompt_token_ids` when given, else the
    rendered prompt text (all chat messages in order) in blocks of block_size_tokens x
    chars_per_token characters. The index learns from its own decisions: the chosen backend is
    recorded as holding every block of the prompt. Each backend's entries are an LRU of
    cache_capacity_tokens / block_size_tokens blocks.
    Rules, in order:
    - `load-guard`: loads are imbalanced (SGLang's abs AND rel test): least `signal`;
    - `prefix-match`: the best match covers more than `cache_threshold` of the prompt's
      blocks; among equal matches the less loaded, then the lower index, wins;
    - `least-load`: otherwise least `signal`, ties to the lowest index.
    """

    config: PrefixAwareConfig

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        hashes = block_hashes(request, self.shape)
        decision = self._decide(backends, hashes)
        return self.decide(next(b for b in backends if b.index == decision.index), hashes, decision.rule,
                           decision.predicted_cached_tokens)

    def _decide(self, backends: Sequence[BackendView], hashes: list[int]) -> Decision:
        cfg = self.config
        loads = [load_of(b, cfg.signal) for b in backends]
        if imbalanced(loads, cfg.balance_abs_threshold, cfg.balance_rel_threshold):
            return Decision(least_loaded(backends, cfg.signal).index, "load-guard")
        if hashes:
            best, matched = self._best_match(backends, loads, hashes)
            if matched / len(hashes) > cfg.cache_threshold:  # the match, known: not looked up again
                return Decision(best.index, "prefix-match", matched * cfg.block_size_tokens)
        return Decision(least_loaded(backends, cfg.signal).index, "least-load")

    def _best_match(
        self, backends: Sequence[BackendView], loads: list[float], hashes: list[int]
    ) -> tuple[BackendView, int]:
        """The longest match; among equal matches the less loaded, then the lower index."""
        scored = [(self.index.match(b.url, hashes), -load, -b.index, b) for b, load in zip(backends, loads, strict=True)]
        matched, _, _, best = max(scored, key=lambda s: s[:3])
        return best, matched

    def match_fraction(self, backend: BackendView, request: RequestInfo) -> float:
        """Share of the request's blocks the index believes `backend` holds (0 for no blocks)."""
        return self.index.match_fraction(backend.url, block_hashes(request, self.shape))
