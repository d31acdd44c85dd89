"""A deterministic harness with the seed lesson's service and cache rules, driving real policies.

Each step builds `BackendView` snapshots from the harness's own state, asks the policy, and
applies the example's rule for what happens next. Nothing here decides where a request goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from policies.routing import BackendView, RequestInfo, create_policy


def printed(value: float, digits: int = 1) -> str:
    """`value` as the seed's Java `%.{digits}f` prints it: half-up on the double's exact value."""
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def views(count: int, **per_backend: list) -> list[BackendView]:
    """`count` backends at http://replica-<i>, with per-backend field values."""
    return [
        BackendView(index=i, url=f"http://replica-{i}", **{k: v[i] for k, v in per_backend.items()})
        for i in range(count)
    ]


@dataclass(frozen=True)
class QueueRun:
    """Outcome of Example 9's single-server replicas."""

    assignments: list[list[int]]
    """Per replica, the requests it served in arrival order."""
    mean_latency: float
    """Mean of finish - arrival, in the example's time units."""
    max_latency: int
    """Worst finish - arrival."""


EXAMPLE_9_WORK = (900, 50, 60, 800, 40, 70, 950, 30, 55, 700, 65, 45)


def run_example_9(spec: str, replicas: int = 3, gap: int = 100) -> QueueRun:
    """Requests arrive every `gap`; each replica serves one at a time in arrival order.

    The snapshot's `in_flight` is the number of the replica's requests unfinished at arrival.
    """
    policy = create_policy(spec)
    free_at = [0] * replicas
    finishes: list[list[int]] = [[] for _ in range(replicas)]
    assigned: list[list[int]] = [[] for _ in range(replicas)]
    latencies = []
    for i, work in enumerate(EXAMPLE_9_WORK):
        arrival = i * gap
        open_counts = [sum(1 for t in finishes[r] if t > arrival) for r in range(replicas)]
        decision = policy.select(views(replicas, in_flight=open_counts), RequestInfo(request_id=str(i)))
        r = decision.index
        finish = max(arrival, free_at[r]) + work
        free_at[r] = finish
        finishes[r].append(finish)
        assigned[r].append(i)
        latencies.append(finish - arrival)
    return QueueRun(assigned, sum(latencies) / len(latencies), max(latencies))


@dataclass(frozen=True)
class CacheRun:
    """Outcome of Example 16's agent sessions."""

    computed: int
    """Prompt tokens prefilled (not found in the replica's cache)."""
    reused: int
    """Prompt tokens served from the replica's prefix cache."""
    work: list[int]
    """Prefill tokens computed per replica."""
    decisions: list[tuple[int, str, tuple[int, ...]]]
    """(replica, rule, work per replica just before the decision) of every request in order."""

    @property
    def hit_rate_percent(self) -> float:
        return 100.0 * self.reused / (self.computed + self.reused)


SYSTEM_TOKENS = 2000
GROWTH_TOKENS = (2400, 600, 600, 600, 2400, 600)
TURNS = 5


def run_example_16(spec: str, replicas: int = 4) -> CacheRun:
    """Six sessions take five turns each; session s appends GROWTH_TOKENS[s] per turn.

    A replica reuses the longest prompt it cached for the session, else the system prompt if it
    has served any session. The snapshot's `prefill_tokens` is the replica's work so far.
    """
    policy = create_policy(spec)
    cached: list[dict[int, int]] = [{} for _ in range(replicas)]
    work = [0] * replicas
    computed = reused = 0
    decisions = []
    for turn in range(1, TURNS + 1):
        for session, growth in enumerate(GROWTH_TOKENS):
            prompt = SYSTEM_TOKENS + growth * turn
            request = RequestInfo(session_key=str(session), prompt_tokens=prompt)
            snapshot = views(replicas, prefill_tokens=[float(w) for w in work])
            decision = policy.select(snapshot, request)
            r = decision.index
            hit = cached[r].get(session, SYSTEM_TOKENS if cached[r] else 0)
            reused += hit
            computed += prompt - hit
            decisions.append((r, decision.rule, tuple(work)))
            work[r] += prompt - hit
            cached[r][session] = prompt
            policy.on_request_complete(snapshot[r], request, prompt_tokens=prompt, cached_tokens=hit)
    return CacheRun(computed, reused, work, decisions)
