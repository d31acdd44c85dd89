"""Starting the fake vLLM: the port is bound at once but refuses connections until the cold start ends."""

from __future__ import annotations

import asyncio
import logging

from fake_engines.driver import faults as fault_hooks
from fake_engines.driver.running import RunningEngine
from fake_engines.driver.serving import bind_socket, start_on_socket
from fake_engines.vllm.app import SERVER_KEY, VllmServer, close_kv_publishers, create_app
from fake_engines.vllm.config import VllmServeConfig

log = logging.getLogger("fake_engines.vllm")


class RunningVllm(RunningEngine):
    """A started fake vLLM: the port is bound at once, listening once the cold start ends."""

    @property
    def server(self) -> VllmServer:
        """Shared handler state."""
        return self.app[SERVER_KEY]

    async def drain_and_close(self) -> None:
        """SIGTERM path: stop accepting, let in-flight requests finish, then stop."""
        self.server.accepting = False
        await self.stop_accepting()
        await self.server.drain()
        await self.close()

    async def close(self) -> None:
        """Stop serving and the engine loops, and close the KV event sockets (also during the cold start)."""
        await super().close()
        await close_kv_publishers(self.server)


async def start_vllm(config: VllmServeConfig, cold_start: bool = True,
                     faults: fault_hooks.FaultInjector | None = None) -> RunningVllm:
    """Bind the port, then after the cold start (scaled by time_scale) listen and serve.

    The returned object is usable at once; `wait_ready` tells when the port accepts connections.
    ModelDoesNotFit is raised before anything is bound, as vLLM fails before serving.
    `faults` (default: none armed, settable by POST /admin/faults) see fake_engines.driver.faults."""
    app = create_app(config)
    faults = faults or fault_hooks.FaultInjector(api_key=config.api_key)
    fault_hooks.install(app, faults, [unit.driver for unit in app[SERVER_KEY].engines])
    try:
        sock = bind_socket(config.host, config.port)
    except OSError:
        await close_kv_publishers(app[SERVER_KEY])
        raise
    running = RunningVllm(runner=None, sock=sock, app=app, ready=asyncio.Event(), bound_port=sock.getsockname()[1])
    delay_s = running.server.spec.cold_start_s * config.time_scale * faults.initial.slow_start_factor \
        if cold_start else 0.0
    log.info("cold start %.2f s (modelled %.1f s)", delay_s, running.server.spec.cold_start_s)

    async def go_live() -> None:
        await asyncio.sleep(delay_s)
        running.runner = await start_on_socket(app, sock)
        faults.attach(running.runner, config.host, running.port)
        running.ready.set()

    running.cold_start = asyncio.get_running_loop().create_task(go_live())
    return running
