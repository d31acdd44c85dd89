"""Starting the fake llama-server: the port opens at once and answers 503 until the model is loaded."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from aiohttp import web

from fake_engines.driver import faults as fault_hooks
from fake_engines.driver.running import RunningEngine
from fake_engines.driver.serving import bind_socket, start_on_socket
from fake_engines.llamacpp.app import SERVER_KEY, LlamaServer, create_app
from fake_engines.llamacpp.config import LlamaServerConfig


class RunningLlama(RunningEngine):
    """A started fake llama-server: listening at once, answering 503 until the model is loaded."""

    @property
    def server(self) -> LlamaServer:
        """Shared handler state."""
        return self.app[SERVER_KEY]

    async def drain_and_close(self) -> None:
        """SIGTERM path: stop accepting, let in-flight requests finish, then stop."""
        await self.stop_accepting()
        await self.server.driver.drain()
        await self.close()


def bind_hosts(hosts: str, port: int) -> list[socket.socket]:
    """One bound socket per address of `--host a,b` (llama-server listens on each); with several,
    an IPv6 one is IPv6-only so `::` does not also claim 0.0.0.0, and port 0 is refused (which free
    port would they share?)."""
    names = [h.strip() for h in hosts.split(",") if h.strip()] or ["127.0.0.1"]
    if len(names) > 1 and port == 0:
        raise OSError("--port 0 is not supported with multiple TCP addresses")
    socks: list[socket.socket] = []
    try:
        for name in names:
            socks.append(bind_socket(name, port, v6only=len(names) > 1))
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


async def start_llama(config: LlamaServerConfig, cold_start: bool = True,
                      faults: fault_hooks.FaultInjector | None = None,
                      setup: Callable[[web.Application], None] | None = None) -> RunningLlama:
    """Listen at once; after the modelled load (scaled by time_scale) the routes start answering.

    `faults` (default: none armed, settable by POST /admin/faults) see fake_engines.driver.faults;
    `setup` changes the app before it serves (router mode installs itself so)."""
    app = create_app(config)
    if setup is not None:
        setup(app)
    faults = faults or fault_hooks.FaultInjector(api_key=config.api_key)
    fault_hooks.install(app, faults, [app[SERVER_KEY].driver])
    sock, *more = bind_hosts(config.host, config.port)
    runner = await start_on_socket(app, sock)
    for extra in more:
        await web.SockSite(runner, extra).start()
    running = RunningLlama(runner, sock, app, asyncio.Event(), bound_port=sock.getsockname()[1])
    faults.attach(runner, config.host.split(",")[0].strip(), running.port)
    delay_s = running.server.spec.cold_start_s * config.time_scale * faults.initial.slow_start_factor \
        if cold_start else 0.0

    async def load() -> None:
        await asyncio.sleep(delay_s)
        running.server.ready = True
        running.ready.set()

    running.cold_start = asyncio.get_running_loop().create_task(load())
    return running
