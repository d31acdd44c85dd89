"""Chains of step end times on the event queue's nanosecond grid, computed in bulk.

Stepping one event at a time, each step of a replica starts at the instant the previous one
ended, so its end is `round(start + duration, 9)` (`sim.events.instant`). For a run of steps
that chain is a cumulative sum of whole nanoseconds, except where a duration sits so near half a
nanosecond that the float sum could round either way; those few steps are chained exactly as
the queue would, and the rest vectorised.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

_EXACT_LIMIT_S = 1e6  # beyond this the float grid is too coarse for the shortcut: plain loop


def _chained(start_s: float, durations_s: Sequence[float]) -> list[float]:
    ends, t = [], start_s
    for duration_s in durations_s:
        t = round(t + duration_s, 9)
        ends.append(t)
    return ends


def step_ends_s(start_s: float, durations_s: Sequence[float]) -> list[float]:
    """[t1, t2, ...] with t_i = round(t_(i-1) + durations_s[i-1], 9) and t_0 = start_s, bit for bit."""
    durations = np.asarray(durations_s, dtype=np.float64)
    last_s = start_s + float(durations.sum())
    if len(durations) < 8 or last_s >= _EXACT_LIMIT_S or round(start_s, 9) != start_s:
        return _chained(start_s, durations.tolist())
    ticks = durations * 1e9
    # float error of t + d, in nanoseconds, stays below two ulps of the largest time
    margin = 2.0 * (math.ulp(last_s) if last_s >= 0.0 else float(np.spacing(last_s))) * 1e9 + 1e-6
    exact = np.flatnonzero(np.abs(ticks - np.floor(ticks) - 0.5) <= margin).tolist()
    steps = np.rint(ticks).astype(np.int64)
    if not exact:  # the usual case: one cumulative sum
        return ((round(start_s * 1e9) + np.cumsum(steps)) / 1e9).tolist()
    ends = np.empty(len(durations))
    t, begin = start_s, 0
    for stop in [*exact, len(durations)]:
        if stop > begin:
            ends[begin:stop] = (round(t * 1e9) + np.cumsum(steps[begin:stop])) / 1e9
            t = float(ends[stop - 1])
        if stop < len(durations):
            t = ends[stop] = round(t + float(durations[stop]), 9)
        begin = stop + 1
    return ends.tolist()
