"""Bulk step end times land on exactly the instants one event per step would (steps last whole
nanoseconds)."""

from __future__ import annotations

import random

from sim.events import instant
from sim.grid import step_ends_s


def _one_by_one(start_s: float, durations_s: list[float]) -> list[float]:
    ends, t = [], start_s
    for duration_s in durations_s:
        t = instant(t + instant(duration_s))
        ends.append(t)
    return ends


def test_bulk_ends_equal_chained_instants_even_at_half_nanoseconds() -> None:
    rng = random.Random(11)
    for trial in range(600):
        start_s = instant(rng.uniform(0.0, rng.choice([1.0, 500.0, 20_000.0, 2e6])))
        base_s = rng.uniform(0.003, 0.05)
        durations = [base_s + rng.uniform(0.0, 1e-5) for _ in range(rng.randint(0, 300))]
        if trial % 2:  # durations a hair from half a nanosecond, where rounding could go either way
            durations = [round(d, 9) + rng.choice([5e-10, -5e-10, 4.999999e-10, 0.0]) for d in durations]
        assert step_ends_s(start_s, durations) == _one_by_one(start_s, durations)
