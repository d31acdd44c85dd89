"""The live driver: runs a clock-free engine core against real (optionally scaled) time.

Loop: ask the core for a step, ask the perf model how long it takes, sleep that long times
`time_scale`, finish the step, hand each request its outputs through an asyncio queue, tell the
observer (metrics) what happened. With pipeline parallelism up to `max_concurrent_batches`
steps are in flight, a new one starting every step_time / pp. Under vLLM's async scheduling the
next step is scheduled as soon as one starts (before its output is applied) and runs when it
ends, as `EngineCore.step_with_batch_queue` does.

Times given to observers are *engine seconds*: the modelled step durations while the engine is
busy, real elapsed time divided by `time_scale` while it idles. A look-alike run at
`--time-scale 0.01` therefore reports the latencies the modelled engine would have.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from fake_engines.core import EngineCore, EngineRequest, RequestOutput, ScheduledStep
from fake_engines.perf.batch import StepBatch
from flotilla.kv_events import KVEvent


@dataclass
class RequestTimes:
    """When a request passed each milestone, in engine seconds since the driver started."""

    arrival_s: float
    """Handed to the driver."""
    scheduled_s: float | None = None
    """Start of the first step that computed it (end of queueing)."""
    first_token_s: float | None = None
    """End of the step that produced its first token."""
    last_token_s: float | None = None
    """End of the step that produced its latest token."""
    finished_s: float | None = None
    """End of the step that finished it."""


@dataclass
class RequestHandle:
    """A submitted request: its outputs arrive on `queue`, its milestones in `times`."""

    request: EngineRequest
    """The request as given to the core (the core updates its progress fields)."""
    times: RequestTimes
    """Milestones, engine seconds."""
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    """RequestOutput items; the last one has finished=True."""
    aborted: bool = False
    """True once the request was aborted (client gone)."""

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """Outputs in order until the finishing one."""
        while True:
            out = await self.queue.get()
            yield out
            if out.finished:
                return


@dataclass(frozen=True)
class StepReport:
    """One finished step, as observers see it."""

    step: ScheduledStep
    """What the core scheduled."""
    outputs: list[RequestOutput]
    """What it produced."""
    started_s: float
    """Engine time the step started."""
    finished_s: float
    """Engine time the step finished."""
    handles: dict[str, RequestHandle]
    """Handles of the requests with outputs in this step (finished ones included)."""
    previous_token_s: dict[str, float]
    """For requests that got a later token: when their previous token came (for inter-token latency)."""


class DriverObserver(Protocol):
    """What the engine surfaces (metrics) hear from the driver."""

    def on_step(self, report: StepReport) -> None:
        """A step finished; outputs were already delivered."""
        ...

    def on_abort(self, handle: RequestHandle, now_s: float) -> None:
        """A request was aborted and its resources freed."""
        ...

    def on_stopped(self, handle: RequestHandle, now_s: float) -> None:
        """The server finished a request itself (a stop string matched); resources freed."""
        ...


log = logging.getLogger("fake_engines.driver")


def _log_crash(task: asyncio.Task) -> None:
    # A crashed step loop would leave every request waiting forever: make it loud.
    if not task.cancelled() and task.exception() is not None:
        log.error("engine step loop stopped", exc_info=task.exception())


class LiveDriver:
    """Drives one engine core in real time; all engine state changes happen on the event loop.

    The engine clock advances by exactly the modelled step durations while steps run, so event-loop
    latency never leaks into step times; while idle it follows real time / time_scale, and a request
    arriving at an idle engine starts its first step at its own arrival time.
    """

    def __init__(self, core: EngineCore, step_time_s: Callable[[StepBatch], float], time_scale: float = 1.0,
                 observer: DriverObserver | None = None,
                 kv_event_sink: Callable[[list[KVEvent]], None] | None = None) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale={time_scale!r}: must be > 0")
        self.core = core
        self.step_time_s = step_time_s
        self.time_scale = time_scale
        self.observer = observer
        self.kv_event_sink = kv_event_sink
        """Gets each finished step's KV cache events (`core.take_kv_events()`) when there are any,
        as vLLM's scheduler publishes one batch per step; None: events are not drained."""
        self.handles: dict[str, RequestHandle] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._inflight: list[tuple[float, float, ScheduledStep]] = []
        self._clock_s = 0.0  # engine time of the last event (step end or idle wake-up)
        self._clock_real = time.monotonic()  # real time of that event
        self._next_start_s = 0.0
        self._core_has_work = True  # False after schedule() returned None, until something changes
        self._idle_wake_s: float | None = None

    def now_s(self) -> float:
        """Engine seconds since the driver was created (never past the next step end while busy)."""
        now = self._clock_s + (time.monotonic() - self._clock_real) / self.time_scale
        if self._inflight:
            return min(now, min(finish for finish, _, _ in self._inflight))
        return now

    def _set_clock(self, engine_s: float) -> None:
        self._clock_s = engine_s
        self._clock_real = time.monotonic()

    def start(self) -> None:
        """Start the step loop on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
            self._task.add_done_callback(_log_crash)

    async def stop(self) -> None:
        """Stop the step loop; in-flight steps are dropped."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def drain(self, poll_s: float = 0.01) -> None:
        """Wait until every submitted request has finished or been aborted."""
        while self.handles:
            await asyncio.sleep(poll_s)

    def submit(self, request: EngineRequest) -> RequestHandle:
        """Queue a request (RequestRejected propagates) and return its handle."""
        now = self.now_s()
        request.arrival_s = now
        self.core.add_request(request)
        handle = RequestHandle(request, RequestTimes(arrival_s=now))
        self.handles[request.request_id] = handle
        if not self._inflight and self._idle_wake_s is None:
            self._idle_wake_s = now
        self._core_has_work = True
        self._wakeup.set()
        return handle

    def finish_remote_kv_load_after(self, request_id: str, after_s: float,
                                    done: Callable[[], None] | None = None) -> None:
        """vLLM P/D, decode side: the request's KV pull ends `after_s` engine seconds from now
        (the modelled transfer); then it may be scheduled, and `done` runs (the pull's
        notification to the prefill engine)."""
        def finished() -> None:
            handle = self.handles.get(request_id)
            if handle is None or handle.aborted:
                return
            self.core.finish_remote_kv_load(request_id)  # type: ignore[attr-defined]  # vLLM cores only
            if not self._inflight and self._idle_wake_s is None:
                self._idle_wake_s = self.now_s()
            self._core_has_work = True
            self._wakeup.set()
            if done is not None:
                done()

        asyncio.get_running_loop().call_later(max(0.0, after_s) * self.time_scale, finished)

    def abort(self, request_id: str) -> None:
        """Abort a request now (client gone): the core frees its KV blocks or slot at once."""
        handle = self.handles.pop(request_id, None)
        if handle is None:
            return
        handle.aborted = True
        self.core.abort_request(request_id)
        if self.observer is not None:
            self.observer.on_abort(handle, self.now_s())
        self._core_has_work = True
        self._wakeup.set()

    def stop_early(self, request_id: str) -> None:
        """The server ends a request itself (a stop string matched): free it now, report it finished."""
        handle = self.handles.pop(request_id, None)
        if handle is None:
            return
        self.core.abort_request(request_id)
        handle.times.finished_s = self.now_s()
        if self.observer is not None:
            self.observer.on_stopped(handle, handle.times.finished_s)
        self._core_has_work = True
        self._wakeup.set()

    async def _run(self) -> None:
        while True:
            if not self._inflight and self._idle_wake_s is not None:
                self._set_clock(max(self._clock_s, self._idle_wake_s))
                self._idle_wake_s = None
            self._launch_steps()
            if not self._inflight:
                self._wakeup.clear()
                if self._idle_wake_s is None:
                    self._set_clock(self.now_s())
                    await self._wakeup.wait()
                continue
            # Sleep to a deadline on a fixed timeline rather than for a duration: the loop's own
            # work between steps must not accumulate as lag, or a time-scaled engine falls ever
            # further behind real time and clients see it slower than modelled.
            target = self._next_event_s()
            deadline = self._clock_real + (target - self._clock_s) * self.time_scale
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            self._clock_s, self._clock_real = target, deadline
            self._finish_due_steps()

    def _launch_steps(self) -> None:
        now = self._clock_s
        while len(self._inflight) < self.core.max_concurrent_batches and now >= self._next_start_s - 1e-12:
            step = self.core.schedule()
            if step is None:
                self._core_has_work = False
                return
            duration_s = self.step_time_s(step.batch)
            start_s = now
            if self.core.async_scheduling and self._inflight:  # the GPU runs steps back to back
                start_s = max(now, self._inflight[-1][0])
            for request_id in (*step.new_request_ids, *step.resumed_request_ids):
                handle = self.handles.get(request_id)
                if handle is not None and handle.times.scheduled_s is None:
                    handle.times.scheduled_s = start_s
            self._inflight.append((start_s + duration_s, start_s, step))
            if not self.core.async_scheduling:  # async: the next step is scheduled at once
                self._next_start_s = now + duration_s / self.core.max_concurrent_batches

    def _next_event_s(self) -> float:
        earliest_finish = min(finish for finish, _, _ in self._inflight)
        if self._core_has_work and len(self._inflight) < self.core.max_concurrent_batches:
            return min(earliest_finish, max(self._next_start_s, self._clock_s))
        return earliest_finish

    def _finish_due_steps(self) -> None:
        self._inflight.sort(key=lambda item: item[0])
        while self._inflight and self._inflight[0][0] <= self._clock_s + 1e-12:
            finish_s, start_s, step = self._inflight.pop(0)
            self._finish(step, start_s, finish_s)
            self._core_has_work = True

    def _finish(self, step: ScheduledStep, started_s: float, finished_s: float) -> None:
        outputs = self.core.finish_step(step)
        if self.kv_event_sink is not None:
            events = self.core.take_kv_events()
            if events:
                self.kv_event_sink(events)
        touched: dict[str, RequestHandle] = {}
        previous: dict[str, float] = {}
        for out in outputs:
            handle = self.handles.get(out.request_id)
            if handle is None:
                continue
            touched[out.request_id] = handle
            self._stamp(handle, out, finished_s, previous)
            handle.queue.put_nowait(out)
            if out.finished:
                del self.handles[out.request_id]
        if self.observer is not None:
            self.observer.on_step(StepReport(step, outputs, started_s, finished_s, touched, previous))

    @staticmethod
    def _stamp(handle: RequestHandle, out: RequestOutput, now_s: float, previous: dict[str, float]) -> None:
        times = handle.times
        if out.new_token_ids:
            if times.first_token_s is None:
                times.first_token_s = now_s
            elif times.last_token_s is not None:
                previous[out.request_id] = times.last_token_s
            times.last_token_s = now_s
        if out.finished:
            times.finished_s = now_s
