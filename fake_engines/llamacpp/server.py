"""Starting the fake llama-server: the port opens at once and answers 503 until the model is loaded."""

from __future__ import annotations

import asyncio

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

    running.cold_start = asyncio.get_running_loop().create_task(load())
    return running
