"""The simulator's clock: a heap of timed events whose handlers return follow-up events.

Events at the same instant run in a fixed order: by `Phase` (completions before arrivals,
then scrapes, then scaling decisions), then in creation order. The heap key is
(time_s, phase, seq) with `seq` from a counter owned by the queue, so two runs of the same
inputs replay exactly. Times are kept to the nanosecond so that sums of decimal seconds tie
exactly when they should.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


class Phase(enum.IntEnum):
    """Tie-break between events at the same instant; lower runs first."""

    COMPLETION = 0  # an engine step or a fixed service ends: frees capacity first
    ARRIVAL = 1  # a request arrives and is routed, seeing the capacity just freed
    SCRAPE = 2  # metrics are sampled after the instant's work
    SCALE = 3  # the autoscaler decides last, on the freshest state


def instant(time_s: float) -> float:
    """`time_s` at the queue's nanosecond resolution: 0.3 + 0.8 must tie with 1.1."""
    return round(time_s, 9)


Handler = Callable[[float], Iterable["Event"] | None]


@dataclass(frozen=True)
class Event:
    """Something that happens at `time_s`; running it may schedule more events."""

    time_s: float
    phase: Phase
    handler: Handler = field(compare=False)


class EventQueue:
    """A deterministic discrete-event loop over virtual seconds."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Handler]] = []
        self._seq = itertools.count()
        self.now_s = 0.0
        self.events_run = 0

    def push(self, event: Event) -> None:
        time_s = instant(event.time_s)
        if time_s < self.now_s:
            raise ValueError(f"event at {event.time_s} s is in the past (now {self.now_s} s)")
        heapq.heappush(self._heap, (time_s, int(event.phase), next(self._seq), event.handler))

    def extend(self, events: Iterable[Event] | None) -> None:
        for event in events or ():
            self.push(event)

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, until_s: float | None = None) -> None:
        """Run events in order until the heap is empty or the next one is after `until_s`."""
        while self._heap:
            if until_s is not None and self._heap[0][0] > until_s:
                break
            time_s, _, _, handler = heapq.heappop(self._heap)
            self.now_s = time_s
            self.events_run += 1
            self.extend(handler(time_s))
