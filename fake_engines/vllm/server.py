"""Starting the fake vLLM: the port is bound at once but refuses connections until the cold start ends."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

from aiohttp import web

from fake_engines.driver import faults as fault_hooks
from fake_engines.driver.serving import bind_socket, start_on_socket
from fake_engines.vllm.app import SERVER_KEY, VllmServer, create_app
from fake_engines.vllm.config import VllmServeConfig

log = logging.getLogger("fake_engines.vllm")


@dataclass
class RunningVllm:
    """A started look-alike: its runner, bound port and shared state."""

    runner: web.AppRunner | None
    """The aiohttp runner, None until the cold start has ended."""
    sock: socket.socket
    """The bound socket (listening once ready)."""
    app: web.Application
    """The application."""
    ready: asyncio.Event
    """Set when the server accepts connections."""
    go_live: asyncio.Task | None = None
    """The task that ends the cold start."""
    bound_port: int | None = None
    """The TCP port, read from the socket once."""

    @property
    def port(self) -> int:
        """The bound TCP port (still known after the socket is closed)."""
        if self.bound_port is None:
            self.bound_port = self.sock.getsockname()[1]
        return self.bound_port

    @property
    def server(self) -> VllmServer:
        """Shared handler state."""
        return self.app[SERVER_KEY]

    async def wait_ready(self) -> None:
        """Return once connections are accepted."""
        await self.ready.wait()

    async def close(self) -> None:
        """Stop serving and the engine loop."""
        if self.go_live is not None and not self.go_live.done():
            self.go_live.cancel()
        if self.runner is not None:
            await self.runner.cleanup()
        else:
            self.sock.close()

    async def drain_and_close(self) -> None:
        """SIGTERM path: stop accepting, let in-flight requests finish, then stop."""
        self.server.accepting = False
        if self.runner is not None:
            for site in list(self.runner.sites):
                await site.stop()
        await self.server.drain()
        await self.close()


async def start_vllm(config: VllmServeConfig, cold_start: bool = True,
                     faults: fault_hooks.FaultInjector | None = None) -> RunningVllm:
    """Bind the port, then after the cold start (scaled by time_scale) listen and serve.

    The returned object is usable at once; `wait_ready` tells when the port accepts connections.
    ModelDoesNotFit is raised before anything is bound, as vLLM fails before serving.
    `faults` (default: none armed, settable by POST /admin/faults) see fake_engines.driver.faults."""
    app = create_app(config)
    faults = faults or fault_hooks.FaultInjector(api_key=config.api_key)
    fault_hooks.install(app, faults, [unit.driver for unit in app[SERVER_KEY].engines])
    sock = bind_socket(config.host, config.port)
    running = RunningVllm(runner=None, sock=sock, app=app, ready=asyncio.Event(), bound_port=sock.getsockname()[1])
    delay_s = running.server.spec.cold_start_s * config.time_scale * faults.initial.slow_start_factor \
        if cold_start else 0.0
    log.info("cold start %.2f s (modelled %.1f s)", delay_s, running.server.spec.cold_start_s)

    async def go_live() -> None:
        await asyncio.sleep(delay_s)
        running.runner = await start_on_socket(app, sock)
        faults.attach(running.runner, config.host, running.port)
        running.ready.set()

    running.go_live = asyncio.get_running_loop().create_task(go_live())
    return running
