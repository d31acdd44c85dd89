"""`precise-prefix`: send a request where the engines' own KV events say its prefix is cached.

Backends that publish KV-cache events are looked up in the `KVIndex` the proxy or the simulator
binds (policies.routing.kv_index); the rest (llama-server publishes none) in an approximate index
of this policy's own decisions, as `prefix-aware` keeps one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo
from policies.routing.kv_index import KVIndexUser
from policies.routing.prefix_index import block_hashes
from policies.routing.prefix_indexed import PrefixIndexedPolicy
from policies.routing.registry import register_policy
from policies.routing.signals import load_of
from policies.routing.validation import (
    require_at_least,
    require_non_negative,
    require_positive,
    require_signal,
)


@dataclass(frozen=True)
class PrecisePrefixConfig:
    signal: str = "in_flight"
    """Load signal of the bound and of the least-load placement: by default the router's own
    count of outstanding requests, exact at pick time. Not the scraped `waiting`: an engine with
    room runs every request at once, so its queue reads 0 and ties everywhere while the work
    piles up (bench/routing_quality: 3.5x the mean prefill on one replica of eight)."""
    balance_abs_threshold: float = 8
    """A backend is out of bounds when its load exceeds the least loaded backend's by more than
    this, in `signal` units..."""
    balance_rel_threshold: float = 1.5
    """...and is also more than this times the least load (SGLang's two-part test, per backend)."""
    block_size_tokens: int = 16
    """Approximate index only (backends without events): tokens per hashed block."""
    chars_per_token: int = 4
    """Approximate index only: characters per token when the prompt is text only."""
    default_capacity_tokens: int = 500_000
    """Approximate index only: size for a backend that reports no cache capacity."""

    def __post_init__(self) -> None:
        require_signal("signal", self.signal)
        require_non_negative("balance_abs_threshold", self.balance_abs_threshold)
        require_at_least("balance_rel_threshold", self.balance_rel_threshold, 1.0)
        require_positive("block_size_tokens", self.block_size_tokens)
        require_positive("chars_per_token", self.chars_per_token)
        require_positive("default_capacity_tokens", self.default_capacity_tokens)


def out_of_bounds(load: float, least: float, abs_threshold: float, rel_threshold: float) -> bool:
    """True when `load` is more than abs_threshold above the least load AND more than
    rel_threshold times it."""
    return load - least > abs_threshold and load > rel_threshold * least


@register_policy("precise-prefix", config=PrecisePrefixConfig)
class PrecisePrefix(KVIndexUser, PrefixIndexedPolicy):
    """Route to the backend holding the longest cached prefix of the request, within a load bound.

    Cached prefix: for a backend that publishes KV events, the tokens of the request's leading
    full blocks that its cache holds now, by the bound KVIndex (the request's
    `prompt_token_ids`, which the router computes as the engine does; without them nothing
    matches). For any other backend, the approximate own-decision index in blocks of
    block_size_tokens (token ids, else block_size_tokens x chars_per_token characters).
    Useful match: a backend's cached prefix less the shortest one among the candidates. Blocks
    every backend holds (a system prompt all requests start with) cannot tell backends apart,
    so they count as no information, as in llm-d, whose min-max normalised prefix score is
    equal on all pods then and lets its queue and KV scorers decide.
    Load bound: a backend is out of bounds when its `signal` exceeds the least loaded
    backend's by more than balance_abs_threshold and is more than balance_rel_threshold times
    it (SGLang's two-part test, per backend); the least loaded backend is never out of bounds.
    Order among equals ("less loaded"): least `signal`, then fewest reserved tokens
    (`in_flight_tokens`), then fewest prefill tokens computed so far, then the lower index, so
    that requests tied on everything the router counts still spread instead of herding onto
    the lowest index.
    Rules:
    - `precise-match` / `approx-match`: the longest useful match among the backends within
      bounds (ties to the less loaded), found in the event index or the approximate one;
    - `load-bound`: as above, but a longer match is on a backend out of bounds;
    - `least-load`: no backend within bounds has a useful match: the less loaded (Dynamo's cost
      with equal overlaps, and SGLang's shortest-queue fallback).
    The predicted cached tokens are the winner's whole cached prefix, shared blocks included.
    """

    config: PrecisePrefixConfig

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        cfg = self.config
        loads = [load_of(b, cfg.signal) for b in backends]
        cached, approx = self._cached_tokens(backends, request)
        least, floor = min(loads), min(cached.values())
        ranked = sorted(zip(backends, loads, strict=True),
                        key=lambda bl: (-cached[bl[0].index], bl[1], bl[0].in_flight_tokens,
                                        bl[0].prefill_tokens, bl[0].index))
        winner, _ = next((b, load) for b, load in ranked
                         if not out_of_bounds(load, least, cfg.balance_abs_threshold, cfg.balance_rel_threshold))
        tokens = cached[winner.index]
        if tokens < cached[ranked[0][0].index]:
            rule = "load-bound"
        elif tokens == floor:
            rule = "least-load"
        else:
            rule = "precise-match" if winner.index not in approx else "approx-match"
        if winner.index in approx:
            self.index.record(winner, approx[winner.index], cfg.block_size_tokens)
        return Decision(winner.index, rule, tokens)

    def _cached_tokens(self, backends: Sequence[BackendView],
                       request: RequestInfo) -> tuple[dict[int, int], dict[int, list[int]]]:
        """Per backend index, cached prompt tokens; and, for backends without events, the
        request's approximate block hashes (recorded there if chosen)."""
        index = self.kv_index
        precise: dict[str, int] = {}
        if index is not None and request.prompt_token_ids:
            precise = index.prefix_tokens(request.prompt_token_ids, request.lora, (b.url for b in backends))
        cached: dict[int, int] = {}
        approx: dict[int, list[int]] = {}
        hashes: list[int] | None = None
        for b in backends:
            if index is not None and index.tracks(b.url):
                cached[b.index] = precise.get(b.url, 0)
                continue
            if hashes is None:
                hashes = block_hashes(request, self.shape)
            approx[b.index] = hashes
            cached[b.index] = self.index.match(b.url, hashes) * self.config.block_size_tokens
        return cached, approx
