"""The arrivals a fleet replays: a synthetic spec, a trace file or a list of requests, cut once.

Both fleets get the same `TraceRequest` list, so a live run and a simulated run (or two policies)
see identical arrivals. Options name loadgen's settings and keep its meaning: `max_requests` and
`duration_s` cut the workload as `loadgen.runner.scheduled` does, with trace time measured from
the first request.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from loadgen.readers import read_trace
from loadgen.results import Slo
from loadgen.stats import parse_slo
from loadgen.synthetic import synthetic_requests
from loadgen.trace import TraceRequest

SYNTHETIC_KINDS = ("poisson:", "gamma:", "agents:")

Workload = str | Path | Iterable[TraceRequest]
"""A synthetic spec (`agents:sessions=6,...`), a trace file, or the requests themselves."""


@dataclass(frozen=True)
class ReplayOptions:
    """How a fleet replays a workload; the loadgen runner's settings that mean the same live and simulated."""

    max_requests: int | None = None
    """Stop after this many requests; None replays them all."""
    duration_s: float | None = None
    """Replay only requests within this many trace seconds of the first."""
    slo: Slo | str | None = None
    """Goodput SLOs as an `Slo` or `ttft=0.5,tpot=0.05`; None reports no goodput."""
    seed: int = 0
    """Seed of a synthetic workload."""
    label: str | None = None
    """Row name in tables; defaults to the fleet's policy."""
    endpoint: str = "completions"
    """Live only: `completions` or `chat` (the simulator has no API surface)."""
    request_timeout_s: float = 120.0
    """Live only: give up on one request after this many wall seconds."""
    trace_format: str | None = None
    """Trace format when the file name does not tell it."""

    def __post_init__(self) -> None:
        if self.max_requests is not None and self.max_requests < 0:
            raise ValueError(f"max_requests must be >= 0, got {self.max_requests}")
        if self.duration_s is not None and self.duration_s < 0:
            raise ValueError(f"duration_s must be >= 0, got {self.duration_s}")
        if isinstance(self.slo, str):
            object.__setattr__(self, "slo", parse_slo(self.slo))

    @classmethod
    def from_kwargs(cls, **options: Any) -> ReplayOptions:
        """Options by keyword; an unknown name is refused with the known ones listed."""
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(options) - known):
            raise TypeError(f"unknown replay option(s) {unknown}; known: {sorted(known)}")
        return cls(**options)


def load_workload(workload: Workload, options: ReplayOptions | None = None) -> list[TraceRequest]:
    """The requests to replay, in arrival order, cut by max_requests and duration_s."""
    options = options or ReplayOptions()
    requests = _requests(workload, options)
    cut = list(itertools.islice(requests, options.max_requests))
    if not cut:
        return cut
    first_s = cut[0].timestamp_s
    if options.duration_s is not None:
        cut = [r for r in cut if r.timestamp_s - first_s <= options.duration_s]
    # time zero is the first arrival, as in the live runner, so both fleets report the same clock
    return [dataclasses.replace(r, timestamp_s=r.timestamp_s - first_s) for r in cut] if first_s else cut


def _requests(workload: Workload, options: ReplayOptions) -> Iterable[TraceRequest]:
    if isinstance(workload, str) and workload.startswith(SYNTHETIC_KINDS):
        return synthetic_requests(workload, seed=options.seed)
    if isinstance(workload, str | Path):
        return read_trace(workload, options.trace_format)
    return workload
