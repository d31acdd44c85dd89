"""Run a look-alike engine on its own event loop in a thread, so sync clients can call it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any


class EngineThread:
    """Context manager: starts `start()` (returning an object with wait_ready/close/port) in a thread."""

    def __init__(self, start: Callable[[], Awaitable[Any]]) -> None:
        self._start = start
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.running: Any = None

    def call(self, coro: Awaitable[Any], timeout_s: float = 60.0) -> Any:
        """Run a coroutine on the engine's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def __enter__(self) -> EngineThread:
        self._thread.start()
        self.running = self.call(self._start())
        self.call(self.running.wait_ready())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self.running.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:<port>."""
        return f"http://127.0.0.1:{self.running.port}"
