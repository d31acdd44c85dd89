"""Look-alike engines started on the test's own event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

Serve = Callable[[Awaitable[Any]], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """serve(start_vllm(...) or start_llama(...)) -> the engine's base URL once it is ready; every
    engine started this way is closed when the test ends, whatever the test did."""
    started: list[Any] = []

    async def start(starting: Awaitable[Any]) -> str:
        running = await starting
        started.append(running)
        await running.wait_ready()
        return f"http://127.0.0.1:{running.port}"

    yield start
    for running in started:
        await running.close()
