"""Shared test helpers. Tests mirror the package tree: tests/<package>/test_<module>.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
"""Inputs the tests read (traces, engine captures, calibration): all inside the repository."""


@pytest.fixture
def repo_root() -> Path:
    return REPO


Serve = Callable[[Awaitable[Any]], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """serve(start_vllm(...) or start_llama(...)) -> the engine's base URL once it is ready; every
    engine started this way is closed when the test ends, whatever the test did. (Here, not in
    tests/fake_engines, because the proxy's tests start look-alike engines too.)"""
    started: list[Any] = []

    async def start(starting: Awaitable[Any]) -> str:
        running = await starting
        started.append(running)
        await running.wait_ready()
        return f"http://127.0.0.1:{running.port}"

    yield start
    for running in started:
        await running.close()
