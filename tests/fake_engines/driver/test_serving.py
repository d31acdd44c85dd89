"""Both look-alikes name their time scale on every response, streamed or not, errors included."""

from __future__ import annotations

import aiohttp
import pytest

from fake_engines.driver.serving import TIME_SCALE_HEADER
from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm


async def _start(flavor: str, time_scale: float):
    if flavor == "vllm":
        config = VllmServeConfig(model="llama-3.1-8b", served_model_name="m", port=0, time_scale=time_scale,
                                 max_model_len=4096)
        return await start_vllm(config, cold_start=False)
    config = LlamaServerConfig(model="llama-3.1-8b-Q4_K_M.gguf", alias="m", port=0, time_scale=time_scale,
                               metrics=True, n_parallel=2, n_ctx=2048)
    return await start_llama(config, cold_start=False)


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
async def test_every_response_names_the_engines_time_scale(flavor):
    running = await _start(flavor, 0.05)
    try:
        await running.wait_ready()
        base = f"http://127.0.0.1:{running.port}"
        stream = {"model": "m", "prompt": "Hello there", "max_tokens": 3, "stream": True}
        async with aiohttp.ClientSession() as session:
            answers = []
            async with session.post(base + "/v1/completions", json=stream) as resp:
                await resp.read()
                answers.append((resp.status, resp.headers.get(TIME_SCALE_HEADER)))
            for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/no-such-route"),
                                 ("POST", "/v1/completions")):
                async with session.request(method, base + path, data=b"{not json") as resp:
                    answers.append((resp.status, resp.headers.get(TIME_SCALE_HEADER)))
    finally:
        await running.close()
    assert [status < 400 for status, _ in answers] == [True, True, True, False, False]
    assert {scale for _, scale in answers} == {"0.05"}
