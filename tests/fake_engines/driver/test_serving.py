"""The edges both look-alikes share, over real sockets: each names its time scale on every
response, and a client gone mid-stream is a quiet abort."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct

import aiohttp
import pytest

from fake_engines.driver.serving import TIME_SCALE_HEADER
from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from tests.fake_engines.scrape import value
from tests.waiting import wait_until

RUNNING = {"vllm": "vllm:num_requests_running", "llamacpp": "llamacpp:requests_processing"}
"""Each engine's gauge of requests it is generating for."""


async def _start(flavor: str, time_scale: float):
    if flavor == "vllm":
        config = VllmServeConfig(model="llama-3.1-8b", served_model_name="m", port=0, time_scale=time_scale,
                                 max_model_len=4096)
        return await start_vllm(config, cold_start=False)
    config = LlamaServerConfig(model="llama-3.1-8b-Q4_K_M.gguf", alias="m", port=0, time_scale=time_scale,
                               metrics=True, n_parallel=1, n_ctx=4096)
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


async def _stalled_stream(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A streamed completion over a raw socket with a tiny receive window, after its first event."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect, so the window stays small
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)  # the client soon stops reading
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 4000, "ignore_eos": True, "stream": True})
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    await reader.readuntil(b"data: ")
    return reader, writer


def _transports(running) -> list[asyncio.Transport]:
    return [conn.transport for conn in running.runner.server.connections if conn.transport is not None]


def _unsent_bytes(running) -> int:
    """Bytes the engine wrote that the client has not taken (its transports' write buffers)."""
    return sum(transport.get_write_buffer_size() for transport in _transports(running))


@pytest.mark.parametrize("how", ["half-close", "reset"])
@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
async def test_a_client_gone_mid_stream_is_a_quiet_abort_that_frees_the_request(flavor, how, caplog):
    caplog.set_level(logging.DEBUG)
    running = await _start(flavor, 0.01)
    try:
        await running.wait_ready()
        base = f"http://127.0.0.1:{running.port}"
        _, writer = await _stalled_stream(running.port)
        for transport in _transports(running):  # a small kernel buffer on the engine's side too, as
            sock = transport.get_extra_info("socket")  # over a network, so unsent events back up soon
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        # the engine has events it cannot send: its next write finds the transport closing once the
        # client leaves, before aiohttp has seen the connection lost and cancelled the handler
        await wait_until(lambda: _unsent_bytes(running) > 0, what="the engine's writes backing up")
        if how == "half-close":
            writer.write_eof()
        else:
            linger_0 = struct.pack("ii", 1, 0)  # close() sends a reset
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_0)
            writer.close()
        async with aiohttp.ClientSession() as session:
            async def freed() -> str | None:
                async with session.get(base + "/metrics") as resp:
                    text = await resp.text()
                return text if value(text, RUNNING[flavor]) == 0 else None

            text = await wait_until(freed, what="the request freed after its client left")
        writer.close()
    finally:
        await running.close()
    if flavor == "vllm":  # vLLM counts no success for an aborted request, only the tokens it made
        assert value(text, "vllm:request_success_total") == 0
        assert 0 < value(text, "vllm:generation_tokens_total") < 4000
    else:  # llama-server counts the cancelled task's tokens
        assert 0 < value(text, "llamacpp:tokens_predicted_total") < 4000
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud and "Traceback" not in caplog.text, caplog.text
