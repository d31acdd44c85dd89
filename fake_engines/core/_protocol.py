"""The step API both look-alike schedulers implement; drivers (live or simulated) call only this."""

from __future__ import annotations

from typing import Protocol

from fake_engines.core._request import EngineRequest, RequestOutput, ScheduledStep, SchedulerStats


class EngineCore(Protocol):
    """A clock-free engine scheduler: the driver decides when steps happen and how long they take.

    A driver loops: `step = schedule()`; if None, wait for a request; else ask the perf model
    how long `step.batch` takes, let that time pass, then `finish_step(step)`. With pipeline
    parallelism it may call `schedule()` again before earlier steps finish, up to
    `max_concurrent_batches` steps in flight.
    """

    max_concurrent_batches: int
    """Steps that may be in flight at once (vLLM pipeline-parallel size; 1 for llama.cpp)."""

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; raises RequestRejected when it can never fit the context."""
        ...

    def abort_request(self, request_id: str) -> bool:
        """Drop a request and free its KV blocks or slot now; False if it is unknown or finished.

        No RequestOutput is produced for an aborted request; its in-flight step skips it."""
        ...

    def schedule(self) -> ScheduledStep | None:
        """Build the next step, or None when nothing can run (idle, or all work in flight)."""
        ...

    def finish_step(self, step: ScheduledStep) -> list[RequestOutput]:
        """Apply a finished step: advance its requests, emit tokens, free finished requests."""
        ...

    def stats(self) -> SchedulerStats:
        """Gauges and counters as of now."""
        ...

    def has_unfinished_requests(self) -> bool:
        """True while any request is queued or running."""
        ...
