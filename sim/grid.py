"""Chains of step end times on the event queue's nanosecond grid, computed in bulk.

A replica's step lasts whole nanoseconds (its modelled duration rounded by `sim.events.instant`)
and starts at the instant the previous one ended, so step i ends at
`instant(t_(i-1) + instant(duration_i))`. Below a million seconds a float's error is far under
half a nanosecond, so that is exactly the start plus a cumulative sum of whole nanoseconds: one
vectorised pass for a whole decode run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

_EXACT_LIMIT_S = 1e6  # beyond this the float grid is too coarse for the shortcut: plain loop
_HALF_NS_MARGIN = 1e-6  # |duration * 1e9 - whole| this near 0.5 is rounded as instant() does


def _chained(start_s: float, durations_s: Sequence[float]) -> list[float]:
    ends, t = [], start_s
    for duration_s in durations_s:
        t = round(t + round(duration_s, 9), 9)
        ends.append(t)
    return ends


def step_ends_s(start_s: float, durations_s: Sequence[float] | npt.NDArray[np.float64]) -> list[float]:
    """[t1, t2, ...] with t_i = instant(t_(i-1) + instant(durations_s[i-1])) and t_0 = start_s, bit for bit."""
    durations = np.asarray(durations_s, dtype=np.float64)
    if len(durations) < 8 or round(start_s, 9) != start_s:
        return _chained(start_s, durations.tolist())
    ticks = durations * 1e9
    steps = np.rint(ticks)
    off_grid = np.abs(ticks - steps)
    # ufunc methods skip numpy's Python wrappers, which cost more than a run's arithmetic
    if np.maximum.reduce(off_grid) > 0.5 - _HALF_NS_MARGIN:
        # ticks carry the product's rounding error; round these few from the exact duration
        for i in np.flatnonzero(off_grid > 0.5 - _HALF_NS_MARGIN).tolist():
            steps[i] = round(round(float(durations[i]), 9) * 1e9)
    ends_ns = np.add.accumulate(steps)  # whole numbers below 2**53 add exactly as floats
    ends_ns += round(start_s * 1e9)
    if ends_ns[-1] >= _EXACT_LIMIT_S * 1e9:
        return _chained(start_s, durations.tolist())
    ends_ns /= 1e9  # n / 1e9 is the float nearest n nanoseconds, as round(x, 9) gives
    ends_s: list[float] = ends_ns.tolist()
    return ends_s
