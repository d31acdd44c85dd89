"""`bounded-hash`: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.hash_ring import RingCache
from policies.routing.registry import register_policy
from policies.routing.signals import least_loaded, load_of
from policies.routing.validation import require_at_least, require_positive, require_signal


@dataclass(frozen=True)
class BoundedHashConfig:
    c: float = 1.25
    """Load factor: no backend takes more than ceil(c x average load), counting this request."""
    signal: str = "in_flight"
    """Load counted against the capacity; a count (in_flight, waiting, running) keeps the
    paper's guarantee."""
    prefix_chars: int = 1024
    """Without a session key, the key is the first `prefix_chars` characters of the prompt."""
    vnodes: int = 160
    """Points per backend on the ring."""

    def __post_init__(self) -> None:
        require_at_least("c", self.c, 1.0)
        require_signal("signal", self.signal)
        require_positive("prefix_chars", self.prefix_chars)
        require_at_least("vnodes", self.vnodes, 1)


@register_policy("bounded-hash", config=BoundedHashConfig)
class BoundedHash(RoutingPolicy):
    """Walk the consistent-hash ring from the request's key; take the first backend under capacity.

    capacity = ceil(c x (total load + 1) / n), the paper's ceil(c m / n) with m counting the new
    request; a backend accepts while its load < capacity. Because the capacity exceeds the mean,
    some backend on the ring always accepts.
    Key: the session key, else the prompt's first `prefix_chars` characters, else the first
    tokens (token ids).
    Rules: `home` (the key's owner accepted), `overflow` (a later backend on the ring),
    `no-key` (nothing to hash: least `signal`). Ties on a load go to the lowest index.
    """

    config: BoundedHashConfig

    def __init__(self, config: object | None = None, rng: random.Random | None = None) -> None:
        super().__init__(config, rng)
        self._rings = RingCache(self.config.vnodes)

    def select(self, backends: Sequence[BackendView], request: RequestInfo) -> Decision | None:
        if not backends:
            return None
        key = self.key_of(request)
        if key is None:
            return Decision(least_loaded(backends, self.config.signal).index, "no-key")
        capacity = self.capacity(backends)
        walk = self._rings.walk(backends, key)
        for position, backend in enumerate(walk):
            if load_of(backend, self.config.signal) < capacity:
                return Decision(backend.index, "home" if position == 0 else "overflow")
        return Decision(least_loaded(backends, self.config.signal).index, "overflow")

    def capacity(self, backends: Sequence[BackendView]) -> float:
        total = sum(load_of(b, self.config.signal) for b in backends)
        return math.ceil(self.config.c * (total + 1) / len(backends))

    def key_of(self, request: RequestInfo) -> str | None:
        if request.session_key:
            return request.session_key
        if request.prompt:
            return request.prompt[: self.config.prefix_chars]
        if request.prompt_token_ids:
            head = request.prompt_token_ids[: self.config.prefix_chars // 4]
            return ",".join(map(str, head))
        return None
