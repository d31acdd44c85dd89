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
    if len(durations) < 8 or round(start_s, 9) != start_s:
        return _chained(start_s, durations.tolist())
    ticks = durations * 1e9
    steps = np.rint(ticks)
    # whole numbers below 2**53 add exactly as floats; the ufunc methods skip numpy's wrappers
    ends_ns = np.add.accumulate(steps)
    ends_ns += round(start_s * 1e9)
    last_s = float(ends_ns[-1]) / 1e9
    if last_s >= _EXACT_LIMIT_S:
        return _chained(start_s, durations.tolist())
    # float error of t + d, in nanoseconds, stays below two ulps of the largest time; doubled
    # again since last_s is itself rounded (a wider margin only sends more steps the exact way)
    margin = 4.0 * math.ulp(abs(last_s)) * 1e9 + 1e-6
    off_grid = np.abs(ticks - steps)
    if np.maximum.reduce(off_grid) < 0.5 - margin:  # the usual case: one cumulative sum
        ends_ns /= 1e9
        return ends_ns.tolist()
    return _split_at(start_s, durations, steps, np.flatnonzero(off_grid >= 0.5 - margin).tolist())


def _split_at(start_s: float, durations: np.ndarray, steps: np.ndarray, exact: list[int]) -> list[float]:
    """Cumulative sums between the `exact` steps, which are chained one at a time."""
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
