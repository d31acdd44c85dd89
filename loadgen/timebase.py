"""Which clock a run's figures are in: the wall clock, or the modelled time of look-alike engines.

A look-alike engine runs `time_scale` wall seconds per modelled second (0.05: 20x faster than the
modelled GPU) and names that scale on every response in the `x-flotilla-time-scale` header, which
the proxy passes through like any engine header. The runner counts the scales its successful
responses carried (`RunResult.meta["target_time_scales"]`); `time_base` turns those counts and the
user's flags into a `TimeBase`, and `in_time_base` divides every time of a result by the scale
(schedule, latencies, gaps, replica samples) and recomputes the summary, so durations, rates,
goodput and the SLOs are judged in the base of the figures printed. A real engine sends no header
and its figures stay wall-clock; a fleet whose engines disagree is reported in wall time, with
the disagreement said, never guessed at.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from fake_engines.driver.serving import TIME_SCALE_HEADER
from loadgen.cost import cost_in_time_scale
from loadgen.results import RequestRecord, RunResult
from loadgen.stats import summarize

__all__ = ["NO_SCALE", "SEEN_KEY", "TIME_SCALE_HEADER", "TimeBase", "check_scale", "count_scales",
           "in_time_base", "parse_scale", "scaled_record", "time_base"]

SEEN_KEY = "target_time_scales"
"""RunResult.meta key: scale as text (or NO_SCALE) -> successful responses that carried it."""
NO_SCALE = "none"
"""Key of responses without a (valid) time-scale header."""


@dataclass(frozen=True)
class TimeBase:
    """The clock figures are reported in."""

    scale: float | None
    """Wall seconds per modelled second that wall times are divided by; None: wall time as measured."""
    source: str | None
    """Where the scale came from: `target` (its header), `--time-scale`; None in wall time."""
    note: str
    """The one line that tells the reader which clock the figures are in."""

    @property
    def name(self) -> str:
        """`modelled` or `wall`, as recorded in RunResult.meta["time_base"]."""
        return "wall" if self.scale is None else "modelled"


def parse_scale(value: str | None) -> float | None:
    """A header value as a time scale; None when absent or not a positive finite number."""
    try:
        scale = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return scale if math.isfinite(scale) and scale > 0 else None


def check_scale(scale: float) -> float:
    """`scale` when it is a usable `--time-scale`; ValueError naming the flag otherwise."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"--time-scale must be a positive number, got {scale:g}")
    return scale


def count_scales(header_values: Mapping[str | None, int]) -> dict[str, int]:
    """{header value or None: responses} -> {scale as text, or NO_SCALE: responses}."""
    counts: dict[str, int] = {}
    for value, count in header_values.items():
        scale = parse_scale(value)
        key = NO_SCALE if scale is None else repr(scale)
        counts[key] = counts.get(key, 0) + count
    return dict(sorted(counts.items()))


def time_base(seen: Mapping[str, int], override: float | None = None, wall: bool = False) -> TimeBase:
    """The clock to report in: `--wall-time`, else `--time-scale`, else the one scale the target named."""
    told = _single_scale(seen)
    if wall:
        said = f"; the target's time scale is {told:g}" if told is not None else ""
        return TimeBase(None, None, f"times are wall-clock (--wall-time{said})")
    if override is not None:
        check_scale(override)
        said = f"; the target said {told:g}" if told is not None and told != override else ""
        return TimeBase(override, "--time-scale", _modelled_note(override, f"--time-scale{said}"))
    if told is not None:
        return TimeBase(told, "target", _modelled_note(told, "time scale from target"))
    if len(seen) > 1:
        return TimeBase(None, None, "times are wall-clock: the target's responses named different time scales "
                        f"({_describe(seen)}); pass --time-scale to choose one")
    return TimeBase(None, None, "times are wall-clock: the target named no time scale")


def _single_scale(seen: Mapping[str, int]) -> float | None:
    """The scale every counted response named, or None (none named, or they disagree)."""
    if len(seen) != 1:
        return None
    (key,) = seen
    return parse_scale(key)


def _modelled_note(scale: float, source: str) -> str:
    return f"times are modelled: measured wall times / {scale:g} ({source}); rates are per modelled second"


def _describe(seen: Mapping[str, int]) -> str:
    return ", ".join(f"{key} on {count}" for key, count in seen.items())


def scaled_record(rec: RequestRecord, time_scale: float) -> RequestRecord:
    """A copy of `rec` with every time divided by `time_scale` (wall seconds to modelled seconds)."""

    def scaled(value: float | None) -> float | None:
        return None if value is None else value / time_scale

    return dataclasses.replace(
        rec, scheduled_time_s=rec.scheduled_time_s / time_scale, send_time_s=rec.send_time_s / time_scale,
        ttft_s=scaled(rec.ttft_s), tpot_s=scaled(rec.tpot_s), e2e_s=scaled(rec.e2e_s),
        itl_s=[gap / time_scale for gap in rec.itl_s])


def in_time_base(result: RunResult, base: TimeBase) -> RunResult:
    """`result` (in wall time, as the runner measured it) in `base`, its meta saying which base."""
    meta = {**result.meta, "time_base": base.name, "time_scale": base.scale, "time_scale_source": base.source}
    if base.scale is None:
        return dataclasses.replace(result, meta=meta)
    scale = base.scale
    meta.update(cost_in_time_scale(meta, scale))
    records = [scaled_record(r, scale) for r in result.requests]
    return dataclasses.replace(result, summary=summarize(records, result.summary.slo), requests=records,
                               meta=meta, replicas=[(t / scale, n) for t, n in result.replicas])
