"""Waiting on a condition with a deadline: the one way tests synchronise, never a fixed sleep.

A fixed sleep is either too short on a busy machine (the test fails) or too long everywhere (the
suite crawls). These poll the condition itself every few milliseconds and give up only after a
deadline generous enough for a loaded 2-core machine, so a test takes as long as its condition."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT_S = 30.0
"""Long enough for a loaded machine; a test that passes never waits this long."""
POLL_S = 0.01


async def wait_until(predicate: Callable[[], T | Awaitable[T]], timeout_s: float = TIMEOUT_S, *,
                     poll_s: float = POLL_S, what: str = "") -> T:
    """Call `predicate` (plain or async) until it returns something truthy, and return that.

    Raises AssertionError naming `what` and the last value if `timeout_s` passes first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() >= deadline:
            raise AssertionError(f"not reached within {timeout_s:g} s: {what or _name(predicate)} (last: {value!r})")
        await asyncio.sleep(poll_s)


def wait_until_sync(predicate: Callable[[], T], timeout_s: float = TIMEOUT_S, *,
                    poll_s: float = POLL_S, what: str = "") -> T:
    """`wait_until` for code outside an event loop (threads, subprocesses)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not reached within {timeout_s:g} s: {what or _name(predicate)} (last: {value!r})")
        time.sleep(poll_s)


def _name(predicate: Callable[..., object]) -> str:
    return getattr(predicate, "__qualname__", repr(predicate))
