"""Agent sessions: prompts that grow every turn over one shared system prompt.

The shape of the seed lesson's Example 16: every prompt starts with the same system prompt and
each turn appends to its session's history, so turn t of session s has
`system + growth[s] * t` tokens and the previous turn's prompt is its prefix. Prompts are given
as hash ids of `block_tokens = gcd(system, growths)` tokens, so the prompt builder makes the
shared parts identical text and a prefix cache can reuse them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from loadgen.trace import TraceRequest

SESSION_ID_STRIDE = 1_000_000  # block ids of session s start at (s + 1) * stride, past the system ids


@dataclass(frozen=True)
class AgentSessions:
    """Multi-turn agent sessions over a shared system prompt."""

    sessions: int = 6
    """Number of concurrent sessions."""
    turns: int = 5
    """Turns per session."""
    system_tokens: int = 2000
    """Shared system-prompt tokens at the start of every prompt."""
    growth_tokens: tuple[int, ...] = (2400, 600, 600, 600, 2400, 600)
    """Tokens each session appends per turn, cycled over sessions (Example 16's defaults)."""
    output_tokens: int = 64
    """Tokens generated per turn."""
    think_s: float = 2.0
    """Seconds between successive turns of a session (trace time, open loop)."""
    stagger_s: float = 0.1
    """Seconds between the starts of successive sessions within a turn."""

    def __post_init__(self) -> None:
        for name in ("sessions", "turns", "output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.system_tokens < 0 or not self.growth_tokens or min(self.growth_tokens) < 1:
            raise ValueError("system must be >= 0 and every growth >= 1")
        if self.think_s < 0 or self.stagger_s < 0:
            raise ValueError("think and stagger must be >= 0 seconds")

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> AgentSessions:
        """From spec options sessions, turns, system, growth (a/b/c), output, think, stagger."""
        names = {"sessions": "sessions", "turns": "turns", "system": "system_tokens",
                 "output": "output_tokens", "think": "think_s", "stagger": "stagger_s"}
        if unknown := sorted(set(opts) - set(names) - {"growth"}):
            raise ValueError(f"unknown agents option(s) {unknown}; known: {sorted([*names, 'growth'])}")
        kwargs: dict[str, object] = {
            names[k]: (float(v) if k in ("think", "stagger") else int(v)) for k, v in opts.items() if k in names}
        if "growth" in opts:
            kwargs["growth_tokens"] = tuple(int(g) for g in opts["growth"].split("/"))
        return cls(**kwargs)  # type: ignore[arg-type]

    @property
    def block_tokens(self) -> int:
        """Largest block size that tiles the system prompt and every growth."""
        return math.gcd(self.system_tokens, *self.growth_tokens)

    def growth(self, session: int) -> int:
        """Tokens session `session` appends per turn."""
        return self.growth_tokens[session % len(self.growth_tokens)]

    def request(self, session: int, turn: int) -> TraceRequest:
        """Turn `turn` (1-based) of session `session` (0-based)."""
        block = self.block_tokens
        system_ids = tuple(range(self.system_tokens // block))
        base = (session + 1) * SESSION_ID_STRIDE
        history = tuple(range(base, base + self.growth(session) * turn // block))
        return TraceRequest(
            timestamp_s=(turn - 1) * self.think_s + session * self.stagger_s,
            input_length=self.system_tokens + self.growth(session) * turn,
            output_length=self.output_tokens, session_id=f"agent-{session}",
            hash_ids=system_ids + history, block_tokens=block)

    def requests(self, rng: random.Random) -> Iterator[TraceRequest]:
        """Every turn of every session in arrival order (turn-major, as in Example 16)."""
        del rng  # the shape is deterministic; the argument keeps one workload interface
        reqs = [self.request(s, t) for t in range(1, self.turns + 1) for s in range(self.sessions)]
        return iter(sorted(reqs, key=lambda r: r.timestamp_s))
