"""Arrival processes: Poisson or gamma gaps at a constant or piecewise rate, and tick jitter.

Every function takes a seeded `random.Random`, so a workload replays exactly. Gaps are true
exponential (or gamma) draws; nothing is clipped. A piecewise rate is handled by drawing gaps
of mean 1 in "operational time" and mapping them back through the integrated rate, which is
exact for Poisson arrivals (the time-change theorem).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from loadgen.trace import TraceRequest


@dataclass(frozen=True)
class RateProfile:
    """A piecewise-constant arrival rate."""

    steps: tuple[tuple[float, float], ...]
    """(start time in seconds, requests per second from then on), starting at 0, sorted."""

    def __post_init__(self) -> None:
        if not self.steps or self.steps[0][0] != 0:
            raise ValueError("rate profile must start at time 0")
        starts = [s for s, _ in self.steps]
        if starts != sorted(set(starts)):
            raise ValueError(f"rate profile start times must increase, got {starts}")
        if any(rate < 0 for _, rate in self.steps) or all(rate == 0 for _, rate in self.steps):
            raise ValueError("rate profile rates must be >= 0 and not all 0")

    @classmethod
    def parse(cls, spec: str) -> RateProfile:
        """`5` (constant) or `2@0/10@30/2@60` (rate@start_s, slash-separated)."""
        steps = []
        for part in spec.split("/"):
            rate, _, start = part.partition("@")
            steps.append((float(start or 0), float(rate)))
        return cls(tuple(steps))

    def operational_to_time(self, work: float) -> float | None:
        """The time t at which the integrated rate reaches `work`; None if it never does."""
        bounds = [s for s, _ in self.steps[1:]] + [float("inf")]
        for (start, rate), end in zip(self.steps, bounds, strict=True):
            span = (end - start) * rate if rate else 0.0
            if work <= span:
                return start + work / rate
            work -= span
        return None


def arrival_times(rng: random.Random, profile: RateProfile, duration_s: float,
                  burstiness: float = 1.0) -> Iterator[float]:
    """Arrival times in [0, duration_s).

    `burstiness` is the gamma shape, as in vLLM's serving benchmark: 1 gives Poisson, below 1
    burstier, above 1 more regular; the mean rate is the profile's either way.
    """
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    work = 0.0
    while True:
        work += rng.gammavariate(burstiness, 1.0 / burstiness)
        at = profile.operational_to_time(work)
        if at is None or at >= duration_s:
            return
        yield at


def jittered(requests: Iterable[TraceRequest], width_s: float, rng: random.Random) -> Iterator[TraceRequest]:
    """Spread each arrival uniformly over [t, t + width_s), still in time order.

    Smooths traces quantised to ticks (Mooncake's conversation trace lands on ~3 s ticks). A
    heap holds only the requests whose new time may still be overtaken, so memory stays bounded
    by the arrivals within one `width_s`.
    """
    if width_s < 0:
        raise ValueError(f"width_s must be >= 0, got {width_s}")
    pending: list[tuple[float, int, TraceRequest]] = []
    order = itertools.count()
    for req in requests:
        # inputs are time-ordered and jitter is >= 0, so nothing later can land before req's old time
        while pending and pending[0][0] <= req.timestamp_s:
            yield heapq.heappop(pending)[2]
        moved = req.timestamp_s + rng.uniform(0.0, width_s)
        heapq.heappush(pending, (moved, next(order), replace(req, timestamp_s=moved)))
    while pending:
        yield heapq.heappop(pending)[2]
