"""--sleep-idle-seconds: llama-server sleeps after that long without a task and wakes on the next.

As server_queue::start_loop and server_routes (tools/server/server-queue.cpp, server-context.cpp):
with nothing running for N seconds the server enters the sleeping state; /health, /props, /models
and /metrics answer without waking it (/props reports is_sleeping, /metrics the counters as they
were on entering sleep, each scrape resetting that snapshot's throughput window); any other route
wakes it first. A scrape made while asleep has already reported the window, so waking clears it.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from fake_engines.llamacpp.metrics import LlamaCounters

CHECK_S = 0.05
"""How often the idle time is checked (the real queue waits up to 1 s between checks)."""
READ_ONLY = frozenset({("GET", "/health"), ("GET", "/v1/health"), ("GET", "/props"), ("GET", "/models"),
                       ("GET", "/v1/models"), ("GET", "/metrics")})
"""Routes served during sleep without waking the server (create_response(true) in server-context.cpp)."""


@dataclass
class SleepState:
    """The idle timer and what was cached on entering sleep."""

    idle_s: float
    """--sleep-idle-seconds; below 0 the server never sleeps."""
    sleeping: bool = False
    last_task: float = 0.0
    in_flight: int = 0
    snapshot: LlamaCounters | None = None
    """server_metrics copied on entering sleep (what /metrics reports while asleep)."""
    reported_while_asleep: bool = False
    """A scrape during sleep reported the throughput window: waking resets the live one."""

    def touch(self, now: float) -> None:
        self.last_task = now

    def should_sleep(self, now: float, busy: bool) -> bool:
        return self.idle_s >= 0 and not self.sleeping and not busy and self.in_flight == 0 \
            and now - self.last_task >= self.idle_s

    def enter(self, counters: LlamaCounters) -> None:
        self.sleeping = True
        self.snapshot = copy.deepcopy(counters)
        self.reported_while_asleep = False

    def wake(self, counters: LlamaCounters, now: float) -> None:
        if not self.sleeping:
            return
        if self.reported_while_asleep:
            counters.bucket_prompt_tokens, counters.bucket_prompt_s = 0, 0.0
            counters.bucket_predicted_tokens, counters.bucket_predicted_s = 0, 0.0
        self.sleeping = False
        self.snapshot = None
        self.last_task = now


SLEEP_KEY = web.AppKey("llama_sleep", SleepState)


def sleep_state(app: web.Application) -> SleepState:
    """The app's sleep state (a never-sleeping one when not installed)."""
    return app.get(SLEEP_KEY) or SleepState(-1)


def is_sleeping(app: web.Application) -> bool:
    return sleep_state(app).sleeping


def sleeping_metrics(app: web.Application) -> LlamaCounters | None:
    """The snapshot /metrics reports while asleep (None when awake)."""
    state = sleep_state(app)
    if not state.sleeping or state.snapshot is None:
        return None
    state.reported_while_asleep = True
    return state.snapshot


def install(app: web.Application, idle_s: float, counters: Callable[[], LlamaCounters],
            busy: Callable[[], bool]) -> None:
    """Sleep after `idle_s` seconds with nothing running (`busy` false); off when idle_s < 0."""
    state = SleepState(idle_s, last_task=time.monotonic())
    app[SLEEP_KEY] = state
    if idle_s < 0:
        return

    @web.middleware
    async def wake_on_task(request: web.Request, handler):
        if (request.method, request.path) in READ_ONLY:
            return await handler(request)
        state.wake(counters(), time.monotonic())
        state.in_flight += 1
        try:
            return await handler(request)
        finally:
            state.in_flight -= 1
            state.touch(time.monotonic())

    async def watch() -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            now = time.monotonic()
            if busy():
                state.touch(now)
            elif state.should_sleep(now, False):
                state.enter(counters())

    async def start(app: web.Application) -> None:
        state.touch(time.monotonic())
        app[_TASK_KEY] = asyncio.get_running_loop().create_task(watch())

    async def stop(app: web.Application) -> None:
        task = app.get(_TASK_KEY)
        if task is not None:
            task.cancel()

    app.middlewares.append(wake_on_task)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)


_TASK_KEY = web.AppKey("llama_sleep_task", asyncio.Task)
