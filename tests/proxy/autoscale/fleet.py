"""A proxy with the autoscaler attached, on a real 127.0.0.1 socket, for the autoscaler tests."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from proxy.app import PROXY_KEY, Proxy, build_app
from proxy.autoscale import AutoscaleConfig, attach
from proxy.autoscale.setup import AutoscaleRuntime
from proxy.config import HealthConfig, ProxyConfig

TIME_SCALE = 0.05
"""Engines and the autoscaler both run 20x faster than modelled."""
ENGINE_CMD = (f"{sys.executable} -m fake_engines.vllm.cli serve llama-3.1-8b --gpu h100 "
              f"--time-scale {TIME_SCALE} --load-gbps 20")


@dataclass
class Fleet:
    url: str
    app: web.Application
    runtime: AutoscaleRuntime

    @property
    def proxy(self) -> Proxy:
        return self.app[PROXY_KEY]


@asynccontextmanager
async def autoscaled_proxy(config: AutoscaleConfig) -> AsyncIterator[Fleet]:
    app = build_app(ProxyConfig(port=0, health=HealthConfig(interval_s=0.1, timeout_s=2.0)))
    runtime = attach(app, config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield Fleet(f"http://127.0.0.1:{runner.addresses[0][1]}", app, runtime)
    finally:
        await runner.cleanup()
