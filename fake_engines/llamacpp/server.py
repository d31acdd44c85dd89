"""Starting the fake llama-server: the port opens at once and answers 503 until the model is loaded."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

from aiohttp import web

from fake_engines.driver import faults as fault_hooks
from fake_engines.driver.serving import bind_socket, start_on_socket
from fake_engines.llamacpp.app import SERVER_KEY, LlamaServer, create_app
from fake_engines.llamacpp.config import LlamaServerConfig


@dataclass
class RunningLlama:
    """A started look-alike."""

    runner: web.AppRunner
    """The aiohttp runner (listening from the start)."""
    sock: socket.socket
    """The listening socket."""
    app: web.Application
    """The application."""
    ready: asyncio.Event
    """Set when the model is loaded (/health turns 200)."""
    load_task: asyncio.Task | None = None
    """The task that ends the load."""
    bound_port: int | None = None
    """The TCP port, read from the socket once."""

    @property
    def port(self) -> int:
        """The bound TCP port (still known after the socket is closed)."""
        if self.bound_port is None:
            self.bound_port = self.sock.getsockname()[1]
        return self.bound_port

    @property
    def server(self) -> LlamaServer:
        """Shared handler state."""
        return self.app[SERVER_KEY]

    async def wait_ready(self) -> None:
        """Return once the model is loaded."""
        await self.ready.wait()

    async def close(self) -> None:
        """Stop serving and the engine loop."""
        if self.load_task is not None:
            self.load_task.cancel()
        await self.runner.cleanup()

    async def drain_and_close(self) -> None:
        """SIGTERM path: stop accepting, let in-flight requests finish, then stop."""
        for site in list(self.runner.sites):
            await site.stop()
        await self.server.driver.drain()
        await self.close()


async def start_llama(config: LlamaServerConfig, cold_start: bool = True,
                      faults: fault_hooks.FaultInjector | None = None) -> RunningLlama:
    """Listen at once; after the modelled load (scaled by time_scale) the routes start answering.

    `faults` (default: none armed, settable by POST /admin/faults) see fake_engines.driver.faults."""
    app = create_app(config)
    faults = faults or fault_hooks.FaultInjector(api_key=config.api_key)
    fault_hooks.install(app, faults, [app[SERVER_KEY].driver])
    sock = bind_socket(config.host, config.port)
    runner = await start_on_socket(app, sock)
    running = RunningLlama(runner, sock, app, asyncio.Event(), bound_port=sock.getsockname()[1])
    faults.attach(runner, config.host, running.port)
    delay_s = running.server.spec.cold_start_s * config.time_scale * faults.initial.slow_start_factor \
        if cold_start else 0.0

    async def load() -> None:
        await asyncio.sleep(delay_s)
        running.server.ready = True
        running.ready.set()

    running.load_task = asyncio.get_running_loop().create_task(load())
    return running
