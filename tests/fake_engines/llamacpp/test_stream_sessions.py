"""X-Conversation-Id sessions on one server, over real sockets: replay from an offset, the
generation outliving its client, a stop cancelling it, lookup, and no session for a failed request."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from tests.waiting import wait_until


async def _lookup(http: aiohttp.ClientSession, base: str, *ids: str) -> list[dict]:
    async with http.post(base + "/v1/streams/lookup", json={"conversation_ids": list(ids)}) as resp:
        return await resp.json()


async def test_session_outlives_its_client_replays_from_an_offset_and_a_stop_ends_it():
    config = LlamaServerConfig(model="llama-3.2-1b-Q8_0.gguf", port=0, time_scale=0.05)
    running = await start_llama(config, cold_start=False)
    base = f"http://127.0.0.1:{running.port}"
    body = {"prompt": "hello", "n_predict": 30, "ignore_eos": True, "stream": True}
    try:
        async with aiohttp.ClientSession() as http:
            # the client reads one event and leaves; the session still receives the whole answer
            async with http.post(base + "/completion", json=body, headers={"X-Conversation-Id": "a::m"}) as resp:
                await resp.content.readline()
            rows = await wait_until(lambda: _done(http, base, "a"), what="session a done")
            async with http.get(base + "/v1/stream", params={"conv_id": "a::m", "from": "0"}) as resp:
                replay = await resp.read()
            assert len(replay) == rows[0]["total_bytes"]
            events = [json.loads(line[6:]) for line in replay.decode().splitlines() if line.startswith("data: ")]
            assert len(events) == 31 and events[-1]["stop"] is True  # 30 tokens, then the final event
            async with http.get(base + "/v1/stream", params={"conv_id": "a::m", "from": "10"}) as resp:
                assert await resp.read() == replay[10:]

            # a stop while generating ends the generation early and forgets the session
            stream = await http.post(base + "/completion", json={**body, "n_predict": 2000},
                                     headers={"X-Conversation-Id": "b"})
            await stream.content.readline()
            async with http.delete(base + "/v1/stream", params={"conv_id": "b"}) as resp:
                assert resp.status == 204
            rest = await asyncio.wait_for(stream.read(), 30)
            assert rest.count(b"data: ") < 1999
            assert await _lookup(http, base, "b") == []
            async with http.get(base + "/v1/stream", params={"conv_id": "b"}) as resp:
                assert resp.status == 404

            # a request refused before streaming leaves nothing to replay
            async with http.post(base + "/completion", json={"stream": True},
                                 headers={"X-Conversation-Id": "c"}) as resp:
                assert resp.status == 400
            assert await _lookup(http, base, "c") == []
            async with http.get(base + "/v1/stream", params={"conv_id": "a::m", "from": "x"}) as resp:
                assert resp.status == 400 and (await resp.json())["error"]["message"] == "Invalid 'from' offset"
    finally:
        await running.drain_and_close()


async def _done(http: aiohttp.ClientSession, base: str, conv: str) -> list[dict]:
    rows = await _lookup(http, base, conv)
    return rows if rows and rows[0]["is_done"] else []
