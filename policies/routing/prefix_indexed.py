"""The base of the policies that keep a prefix index of their own decisions."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from policies.routing.base import BackendView, Decision, RoutingPolicy
from policies.routing.prefix_index import BlockShape, PrefixIndex


class PrefixIndexConfig(Protocol):
    """The fields every prefix-indexed policy's config has."""

    @property
    def block_size_tokens(self) -> int: ...

    @property
    def chars_per_token(self) -> int: ...

    @property
    def default_capacity_tokens(self) -> int: ...


class PrefixIndexedPolicy(RoutingPolicy):
    """Keeps `index`, a `PrefixIndex` fed by the policy's own decisions, and cuts prompts with
    `shape`; the config names block_size_tokens, chars_per_token and default_capacity_tokens."""

    config: PrefixIndexConfig

    def __init__(self, config: object | None = None, rng: random.Random | None = None) -> None:
        super().__init__(config, rng)
        cfg = self.config
        self.shape = BlockShape(cfg.block_size_tokens, cfg.chars_per_token)
        self.index = PrefixIndex(cfg.default_capacity_tokens // cfg.block_size_tokens)

    def decide(self, winner: BackendView, hashes: Sequence[int], rule: str,
               predicted: int | None = None) -> Decision:
        """The decision for `winner`, predicting the prompt tokens it held (`predicted` when the
        caller matched it already); then the index records it as holding every block of the prompt."""
        size = self.config.block_size_tokens
        held = self.index.match(winner.url, hashes) if predicted is None else predicted // size
        self.index.record(winner, hashes, size)
        return Decision(winner.index, rule, held * size)

    def reset(self) -> None:
        self.index.clear()
