"""What a run's fleet cost: replica-seconds, GPU-seconds, scale events and cold starts.

One definition for live runs (from the replica counts polled off the router) and simulated
ones (from each replica's launch and stop): a replica is paid for from its launch until it
stops, so starting, ready and draining time all count. GPU-seconds weigh each replica by the
GPUs it holds (tensor x pipeline parallel). The figures land in `RunResult.meta` under the keys
of `COST_KEYS`; `loadgen compare` and `flotilla sim` print them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

COST_KEYS = ("replica_seconds", "gpu_seconds", "scale_events", "cold_starts")


@dataclass(frozen=True)
class Span:
    """`replicas` replicas of `gpus` GPUs each, paid for from `start_s` to `end_s`."""

    start_s: float
    end_s: float
    gpus: int = 1
    replicas: int = 1


@dataclass(frozen=True)
class ScaleEvent:
    """One change of the fleet's size, as `meta.scale_events` lists it."""

    at_s: float
    """Seconds from the run start."""
    direction: str
    """`up` or `down`."""
    from_replicas: int
    to_replicas: int
    reason: str
    """The scaling decision's reason label (`scale-up`, `panic`, ...); `observed` for a live run,
    where only the count is seen."""
    detail: str = ""


def cost_meta(spans: Iterable[Span], scale_events: Sequence[ScaleEvent], cold_starts: int) -> dict[str, Any]:
    """The cost keys of a result's meta."""
    spans = list(spans)
    return {
        "replica_seconds": sum((s.end_s - s.start_s) * s.replicas for s in spans),
        "gpu_seconds": sum((s.end_s - s.start_s) * s.replicas * s.gpus for s in spans),
        "scale_events": [asdict(e) for e in scale_events],
        "cold_starts": cold_starts,
    }


def spans_from_counts(counts: Sequence[tuple[float, int]], end_s: float, gpus: int = 1) -> list[Span]:
    """A step function of (time, replicas paid for) samples held until `end_s`, as spans."""
    bounds = [t for t, _ in counts[1:]] + [max(end_s, counts[-1][0])] if counts else []
    return [Span(t, until, gpus, n) for (t, n), until in zip(counts, bounds, strict=True) if n > 0]


def events_from_counts(counts: Sequence[tuple[float, int]]) -> list[ScaleEvent]:
    """Every change of a polled replica count, reason `observed`."""
    return [ScaleEvent(t, "up" if n > before else "down", before, n, "observed")
            for (_, before), (t, n) in zip(counts, counts[1:], strict=False) if n != before]


def live_cost(counts: Sequence[tuple[float, int]], end_s: float, gpus: int = 1) -> dict[str, Any]:
    """Cost of a live run from the router's polled count of replicas it lists (any state): each
    rise is a launch, so a cold start. Without samples (the router exports no replica states)
    every figure is None: unknown, not free."""
    if not counts:
        return {**dict.fromkeys(COST_KEYS), "gpus_per_replica": gpus}
    events = events_from_counts(counts)
    launched = sum(e.to_replicas - e.from_replicas for e in events if e.direction == "up")
    meta = cost_meta(spans_from_counts(counts, end_s, gpus), events, launched)
    meta["gpus_per_replica"] = gpus
    return meta


def cost_in_time_scale(meta: dict[str, Any], time_scale: float) -> dict[str, Any]:
    """The cost keys of `meta` with wall seconds turned into modelled ones (divided by `time_scale`)."""
    out = {key: meta[key] / time_scale for key in ("replica_seconds", "gpu_seconds") if meta.get(key) is not None}
    if meta.get("scale_events"):
        out["scale_events"] = [{**e, "at_s": e["at_s"] / time_scale} for e in meta["scale_events"]]
    return out
