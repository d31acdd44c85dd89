"""--sleep-idle-seconds over real sockets: asleep after the idle time, read-only routes do not wake
it, /metrics while asleep is the snapshot of entering sleep, any other route wakes it."""

from __future__ import annotations

import aiohttp

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from tests.waiting import wait_until


async def _sleeping(http: aiohttp.ClientSession, base: str) -> bool:
    async with http.get(base + "/props") as resp:
        return (await resp.json())["is_sleeping"]


async def test_server_sleeps_when_idle_serves_read_only_routes_asleep_and_wakes_on_a_task():
    config = LlamaServerConfig(model="llama-3.2-1b-Q8_0.gguf", port=0, time_scale=0.01, metrics=True,
                               sleep_idle_seconds=1)
    running = await start_llama(config, cold_start=False)
    base = f"http://127.0.0.1:{running.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(base + "/completion", json={"prompt": "hello", "n_predict": 4}) as resp:
                assert resp.status == 200
            assert not await _sleeping(http, base)
            for _ in range(2):  # the first scrape reports and resets the throughput window, the second is empty
                async with http.get(base + "/metrics") as resp:
                    awake = await resp.text()
            assert "llamacpp:tokens_predicted_total 4\n" in awake and "predicted_tokens_seconds 0\n" in awake
            await wait_until(lambda: _sleeping(http, base), what="asleep")
            for path in ("/health", "/models", "/metrics"):
                async with http.get(base + path) as resp:
                    assert resp.status == 200
            async with http.get(base + "/metrics") as resp:  # the snapshot taken on entering sleep
                assert await resp.text() == awake
            assert await _sleeping(http, base)
            async with http.post(base + "/tokenize", json={"content": "hi"}) as resp:
                assert resp.status == 200
            assert not await _sleeping(http, base)
    finally:
        await running.drain_and_close()
