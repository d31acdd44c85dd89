"""Bounded admission per model: a fixed number of requests in flight, a bounded FIFO queue behind
them, and 429 with a computed Retry-After once the queue is full.

Memory per model is bounded by `max_in_flight + max_queued` requests, however many arrive: a
request past that is answered at once without reading further. Retry-After is the time the queue
ahead is expected to take to drain: queued requests / slots x the mean service time (an
exponentially weighted average of how long a slot is held).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from proxy.errors import ProxyError

SERVICE_EWMA_WEIGHT = 0.1
"""Weight of the newest service time in the running mean."""
INITIAL_SERVICE_S = 1.0
"""Mean service time assumed before a request of the model has finished."""


def retry_after_s(queued: int, slots: int, mean_service_s: float) -> int:
    """Whole seconds (at least 1) for `queued` requests to drain through `slots` slots."""
    return max(1, math.ceil(queued / slots * mean_service_s))


@dataclass
class ModelGate:
    """Slots and queue of one model."""

    slots: int
    """Requests forwarded at once."""
    max_queued: int
    """Waiting requests at most."""
    in_flight: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    mean_service_s: float = INITIAL_SERVICE_S
    rejected: int = 0
    """Requests answered 429 because the queue was full."""

    def try_take(self) -> bool:
        if self.in_flight < self.slots and not self.waiters:
            self.in_flight += 1
            return True
        return False

    def enqueue(self) -> asyncio.Future[None]:
        if len(self.waiters) >= self.max_queued:
            self.rejected += 1
            wait_s = retry_after_s(len(self.waiters) + 1, self.slots, self.mean_service_s)
            raise ProxyError(429, "Too many requests are queued for this model; retry later.",
                             code="queue_full", headers={"Retry-After": str(wait_s)})
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        return fut

    def give_back(self, service_s: float) -> None:
        """A slot's request finished after `service_s`: hand the slot to the next waiter."""
        self.mean_service_s += SERVICE_EWMA_WEIGHT * (service_s - self.mean_service_s)
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes on: in_flight stays
                return
        self.in_flight -= 1

    def leave(self, fut: asyncio.Future[None]) -> None:
        """A waiter gave up (timeout or client gone)."""
        if fut in self.waiters:
            self.waiters.remove(fut)
        elif fut.done() and not fut.cancelled():
            self.give_back(self.mean_service_s)  # it had been handed a slot: pass it on


class Admission:
    """One gate per model name (requests without a model share the "" gate)."""

    def __init__(self, slots: int, max_queued: int, queue_timeout_s: float, max_models: int = 1024) -> None:
        self.slots = slots
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self.max_models = max_models
        """Distinct gates at most: names past it share one gate, so clients cannot grow memory."""
        self.gates: dict[str, ModelGate] = {}

    def gate(self, model: str) -> ModelGate:
        if model not in self.gates and len(self.gates) >= self.max_models:
            model = "\0overflow"
        if model not in self.gates:
            self.gates[model] = ModelGate(self.slots, self.max_queued)
        return self.gates[model]

    @asynccontextmanager
    async def slot(self, model: str | None) -> AsyncIterator[None]:
        """Hold one of the model's slots for the body of the `async with`."""
        gate = self.gate(model or "")
        if not gate.try_take():
            await self.wait(gate)
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            yield
        finally:
            gate.give_back(loop.time() - start)

    async def wait(self, gate: ModelGate) -> None:
        """Queue for one of `gate`'s slots (after `try_take` failed): it is the caller's once this
        returns; ProxyError 429 when the queue is full or the wait too long."""
        fut = gate.enqueue()
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await asyncio.shield(fut)
        except TimeoutError:
            gate.leave(fut)
            raise ProxyError(503, "The request waited too long in the proxy's queue.", code="queue_timeout",
                             headers={"Retry-After": str(retry_after_s(len(gate.waiters), gate.slots,
                                                                       gate.mean_service_s))}) from None
        except asyncio.CancelledError:
            gate.leave(fut)
            raise

    def queued(self) -> int:
        return sum(len(g.waiters) for g in self.gates.values())
