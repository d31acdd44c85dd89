"""A started look-alike engine, whichever it is: its socket, runner, readiness and shutdown."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

from aiohttp import web


@dataclass
class RunningEngine:
    """What both look-alikes return once started; each adds its own `server` view."""

    runner: web.AppRunner | None
    """The aiohttp runner; None while a vLLM look-alike still refuses connections."""
    sock: socket.socket
    """The bound socket (listening once the runner exists)."""
    app: web.Application
    """The application."""
    ready: asyncio.Event
    """Set when the engine serves requests."""
    bound_port: int | None = None
    """The TCP port, read from the socket once."""
    cold_start: asyncio.Task | None = None
    """The task that ends the cold start."""

    @property
    def port(self) -> int:
        """The bound TCP port (still known after the socket is closed)."""
        if self.bound_port is None:
            self.bound_port = self.sock.getsockname()[1]
        return self.bound_port

    async def wait_ready(self) -> None:
        """Return once the engine serves requests."""
        await self.ready.wait()

    async def close(self) -> None:
        """Stop serving and the engine loop."""
        if self.cold_start is not None and not self.cold_start.done():
            self.cold_start.cancel()
        if self.runner is not None:
            await self.runner.cleanup()
        else:
            self.sock.close()

    async def stop_accepting(self) -> None:
        """SIGTERM's first move: close the listening sites, keep the connections open."""
        if self.runner is not None:
            for site in list(self.runner.sites):
                await site.stop()
