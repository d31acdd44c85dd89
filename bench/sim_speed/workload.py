"""The benchmark's workload: a trace replayed back to back until it holds N requests.

Each pass through the trace is shifted by the trace's span plus its mean arrival gap, so the
passes follow one another at the trace's own rate and the arrival order stays sorted.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path

from loadgen.readers import read_trace
from loadgen.trace import TraceRequest


def looped(path: str | Path, num_requests: int) -> Iterator[TraceRequest]:
    """The first `num_requests` requests of `path` read again and again, timestamps shifted."""
    first = list(read_trace(path))
    if not first:
        raise ValueError(f"{path} holds no requests")
    span_s = first[-1].timestamp_s - first[0].timestamp_s
    period_s = span_s + span_s / max(1, len(first) - 1)
    for n, req in zip(range(num_requests), itertools.cycle(first), strict=False):
        shift_s = (n // len(first)) * period_s
        yield req if not shift_s else dataclasses.replace(req, timestamp_s=req.timestamp_s + shift_s)
