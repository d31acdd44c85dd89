"""The main capture runs' recordings made again of a look-alike, the way the capture run made them
(its `_scripts/capture.py`), written in the same text formats (bench.fidelity.recordings).

The real recordings were made on a CPU (vLLM about 1.68 ms a token, llama-server 0.31 ms, the
speed probes' records); the look-alike runs at a time scale that makes its modelled token `SPEED_UP`
times faster on the wall clock than the real one, and every wait of the capture run (the sampler's
100 ms, the 0.5 s before a disconnect, the 1 s before the snapshot under load) shrinks by as much,
so each scenario sees what the real one saw in the same proportions, faster. Fixed sleeps after a
scenario are waits until the look-alike is idle.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.fidelity import recordings as rec
from bench.fidelity.replay import CAPTURES, index_rows, replay_engine

Start = Callable[..., AbstractAsyncContextManager[str]]
"""start(time_scale=..., cold_start=..., port=...) -> a look-alike started as the run's engine, its base URL."""

MODEL = "tiny-llama"
PROMPT = "Hello world, the quick brown fox"
MESSAGES = [{"role": "user", "content": "Hello world, tell me a story"}]
FOLLOW = {"vllm": r"^vllm:(num_requests_running|num_requests_waiting|num_requests_waiting_by_reason|kv_cache_usage_perc"
                  r"|generation_tokens_total|request_success_total|num_preemptions_total)\{",
          "llama.cpp": r"^llamacpp:(requests_processing|requests_deferred|n_decode_total|tokens_predicted_total"
                       r"|prompt_tokens_total|n_busy_slots_per_decode|kv_cache_usage_ratio|kv_cache_tokens) "}
"""The series the capture run's sampler followed (its SAMPLER_RE_*)."""
PREFIX_FOLLOW = {"vllm": ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                          "vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_by_source_total",
                          "vllm:prompt_tokens_cached_by_source_total"],
                 "llama.cpp": ["llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:n_decode_total",
                               "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total",
                               "llamacpp:n_busy_slots_per_decode", "llamacpp:kv_cache_usage_ratio",
                               "llamacpp:kv_cache_tokens", "llamacpp:n_tokens_max"]}
"""The series the capture run's prefix-cache delta listed (its `names`, FOLLOW for llama-server)."""
SPEED_UP = {"vllm": 10.0, "llama.cpp": 2.0}
"""How much faster than the real engine's token the look-alike's runs on the wall clock."""
STARTUP_TIME_SCALE = {"vllm": 0.005, "llama.cpp": 0.04}
"""The cold starts' time scales: vLLM's 18 s modelled start in about 0.1 s (refused throughout, so its
length does not matter); llama-server's 3.7 s in about 0.15 s, so a busy machine's polls still see
the loading 503 the real 1 ms poll saw for 18 ms."""
BUSY = {"vllm": "vllm:num_requests_running", "llama.cpp": "llamacpp:requests_processing"}


def real_ms_per_token(engine: str) -> tuple[float, int]:
    """(ms a token, long requests' max_tokens) of the real run's speed probe record."""
    text = rec.recorded(engine, next(n for n, k in rec.recordings(engine) if k == "probe"))
    match = re.search(r"~([\d.]+) ms/token .* max_tokens=(\d+)", text)
    assert match is not None, text
    return float(match.group(1)), int(match.group(2))


def request_body(engine: str, case: str) -> bytes:
    """The request body of the main run's capture of a case."""
    name = next(n for n, *_ in index_rows(engine) if n.endswith(case))
    return (CAPTURES / engine / f"{name}.req.json").read_bytes()


async def record_engine(engine: str, start: Start) -> dict[str, str]:
    """Every recording of the engine's main run made of look-alikes: recording name -> text."""
    names = dict(rec.recordings(engine))
    out: dict[str, str] = {}
    for name, kind in names.items():
        if kind == "startup":
            poll_s = 0.001 if "1ms_poll" in name else 0.05
            out[name] = await startup_timeline(start, poll_s, STARTUP_TIME_SCALE[engine])
    per_token_ms, long_tokens = real_ms_per_token(engine)
    modelled = await modelled_s_per_token(engine, start)
    wall_s = per_token_ms / 1000 / SPEED_UP[engine]
    async with start(time_scale=wall_s / modelled) as base:
        scenario = Scenario(engine, base, 1 / SPEED_UP[engine])
        chunks_at = _number(next(n for n in names if "chunk_timing" in n))
        prefix = [n for n, *_ in index_rows(engine) if re.match(r"^\d{3}_prefix_", n)]
        probe_at = _number(next(n for n, *_ in index_rows(engine) if "speed_probe" in n))
        # the main run's requests before each recording, so the look-alike has the real one's history
        await _replay(engine, base, lambda n: _number(n) < chunks_at)
        out |= _named(names, await scenario.stream_chunks())
        await _replay(engine, base, lambda n: chunks_at < _number(n) < _number(prefix[0]))
        out |= _named(names, await scenario.prefix_delta())
        await _replay(engine, base, lambda n: _number(prefix[-1]) < _number(n) < probe_at)
        out |= _named(names, await scenario.probe(per_token_ms, long_tokens))
        for label, how in (("disconnect_after_0.5s", {"after_s": 0.5}), ("disconnect_after_20_events", {"after_events": 20})):
            out |= _named(names, await scenario.disconnect(label, long_tokens, **how))
        for mode in ("nonstream", "stream"):
            tokens = long_tokens if mode == "nonstream" else max(100, long_tokens // 3)
            out |= _named(names, await scenario.concurrency(mode, tokens))
    return out


def _number(name: str) -> int:
    return int(name[:3])


async def _replay(engine: str, base: str, which: Callable[[str], bool]) -> None:
    """The main run's request rows `which` picks sent in order, as the capture replay sends them."""
    await replay_engine(engine, base, names={n for n, *_ in index_rows(engine) if which(n)})


def _named(names: dict[str, str], made: dict[str, str]) -> dict[str, str]:
    """Recordings keyed by the real file name that ends with each suffix made."""
    return {name: text for suffix, text in made.items() for name in names if name.split("_", 1)[1] == suffix}


async def startup_timeline(start: Start, poll_s: float, time_scale: float) -> str:
    """/health polled from before the look-alike starts until its first 200, transitions only."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lines, last, t0 = [], object(), time.monotonic()
    async with aiohttp.ClientSession() as session:
        async def poll() -> int | None:
            nonlocal last
            try:
                async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                    state: Any = (resp.status, await resp.text())
            except aiohttp.ClientConnectorError:
                state = None
            if state != last:
                t = time.monotonic() - t0
                lines.append(rec.startup_line(t, None) if state is None else rec.startup_line(t, *state))
                last = state
            return None if state is None else state[0]
        await poll()  # before the process (here: the look-alike) is started, as the capture polled
        async with start(time_scale=time_scale, cold_start=True, port=port, wait=False):
            while await poll() != 200:
                await asyncio.sleep(poll_s / 10)  # ten times finer than the real poll, as the cold start is faster
    return "# polled /health from start; transitions only\n" + "\n".join(lines) + "\n"


async def modelled_s_per_token(engine: str, start: Start) -> float:
    """Engine seconds a token of a lone 64-token request takes on the look-alike."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 64, "ignore_eos": True, "temperature": 0}
    name = "vllm:e2e_request_latency_seconds_sum" if engine == "vllm" else "llamacpp:tokens_predicted_seconds_total"
    async with start(time_scale=0.01) as base, aiohttp.ClientSession() as session:
        before = _value(await _get(session, base + "/metrics"), name)
        async with session.post(base + "/v1/completions", json=body) as resp:
            await resp.read()
        return (_value(await _get(session, base + "/metrics"), name) - before) / 64


async def _get(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as resp:
        return await resp.text()


def _value(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


class Scenario:
    """The capture run's basic and dynamic recordings against one look-alike, waits scaled by `scale`."""

    def __init__(self, engine: str, base: str, scale: float) -> None:
        self.engine, self.base, self.scale = engine, base, scale
        self.host, self.port = base.removeprefix("http://").split(":")
        self.chat = "/v1/chat/completions"

    async def stream_chunks(self) -> dict[str, str]:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "stream": True,
                "stream_options": {"include_usage": True}}
        raw, chunks = await self.stream_request(self.chat, body)
        return {"chat_stream_raw_socket_transcript.http": raw.decode("latin-1"),
                "chat_stream_chunk_timing.txt": "".join(rec.chunks_line(t, b) + "\n" for t, b in chunks)}

    async def prefix_delta(self) -> dict[str, str]:
        async with aiohttp.ClientSession() as session:
            before = await _get(session, self.base + "/metrics")
            for name, _method, path in index_rows(self.engine):
                if re.match(r"^\d{3}_prefix_", name):
                    body = (CAPTURES / self.engine / f"{name}.req.json").read_bytes()
                    # the capture elides its 403-token prefix; one as long in the look-alike's tokens
                    body = re.sub(rb"<<prefix_prompt[^>]*>>", b"abcd" * 403, body)
                    async with session.post(self.base + path, data=body,
                                            headers={"Content-Type": "application/json"}) as resp:
                        await resp.read()
            after = await _get(session, self.base + "/metrics")
        return {"prefix_cache_counter_delta.txt": rec.series_changed(before, after, PREFIX_FOLLOW[self.engine])}

    async def probe(self, real_ms: float, long_tokens: int) -> dict[str, str]:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 64, "ignore_eos": True, "temperature": 0}
        async with aiohttp.ClientSession() as session:
            t0 = time.monotonic()
            async with session.post(self.base + "/v1/completions", json=body) as resp:
                answer = await resp.json()
            per_token_ms = (time.monotonic() - t0) / 64 * 1000
        tokens = answer.get("usage", {}).get("completion_tokens")
        if tokens != 64:
            return {"speed_probe_result.txt": f"probe answered {tokens} tokens, not 64\n"}
        return {"speed_probe_result.txt": f"~{per_token_ms:.2f} ms/token single stream; long requests use "
                                          f"max_tokens={long_tokens}\n"}

    async def disconnect(self, label: str, tokens: int, after_s: float | None = None,
                         after_events: int | None = None) -> dict[str, str]:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": tokens, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        async with aiohttp.ClientSession() as session:
            before = await _get(session, self.base + "/metrics")
            async with self.sampling(session) as lines:
                await asyncio.sleep(0.6 * self.scale)
                raw, _ = await self.stream_request(self.chat, body, after_events=after_events,
                                                   after_s=None if after_s is None else after_s * self.scale)
                await self.idle(session)
            after = await _get(session, self.base + "/metrics")
        return {f"{label}_metrics_before.txt": before, f"{label}_partial_transcript.http": raw.decode("latin-1"),
                f"{label}_gauge_timeline.txt": "\n".join(lines) + "\n", f"{label}_metrics_after.txt": after,
                f"{label}_all_series_changed.txt": rec.series_changed(before, after)}

    async def concurrency(self, mode: str, tokens: int) -> dict[str, str]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async with self.sampling(session) as lines:
                await asyncio.sleep(0.5 * self.scale)
                t0 = time.monotonic()
                tasks = [asyncio.create_task(self.one(session, i, mode, tokens, t0)) for i in range(5)]
                await asyncio.sleep(1.0 * self.scale)
                during = await _get(session, self.base + "/metrics")
                slots = None
                if self.engine == "llama.cpp":
                    async with session.get(self.base + "/slots") as resp:
                        slots = f"HTTP/1.1 {resp.status} {resp.reason}\r\n\r\n{await resp.text()}"
                records = await asyncio.gather(*tasks)
                await self.idle(session)
        out = {f"concurrency_{mode}_metrics_snapshot_during_load.txt": during,
               f"concurrency_{mode}_gauge_timeline.txt": "\n".join(lines) + "\n",
               f"concurrency_{mode}_per_request.txt": "".join(r + "\n" for r in records)}
        if slots is not None:
            out[f"concurrency_{mode}_slots_during_load.http"] = slots
        return out

    async def one(self, session: aiohttp.ClientSession, i: int, mode: str, tokens: int, t0: float) -> str:
        body: dict[str, Any] = {"model": MODEL, "prompt": f"request {i}: " + PROMPT, "max_tokens": tokens,
                                "stream": mode == "stream", "ignore_eos": True}
        if mode == "stream":
            body["stream_options"] = {"include_usage": True}
        sent = time.monotonic()
        async with session.post(self.base + "/v1/completions", json=body) as resp:
            first = None
            data = b""
            async for chunk in resp.content.iter_any():
                first = first if first is not None else time.monotonic()
                data += chunk
        end = time.monotonic()
        return rec.per_request_line(i, sent - t0, resp.status, (first or end) - sent, end - sent, data)

    async def idle(self, session: aiohttp.ClientSession) -> None:
        """Until no request runs, then two sampler periods more (the capture run slept 4 s)."""
        deadline = time.monotonic() + 60
        while _value(await _get(session, self.base + "/metrics"), BUSY[self.engine]) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError("the look-alike did not go idle")
            await asyncio.sleep(0.01 * self.scale)
        await asyncio.sleep(0.2 * self.scale)

    def sampling(self, session: aiohttp.ClientSession) -> AbstractAsyncContextManager[list[str]]:
        return _Sampler(self, session)

    async def sample(self, session: aiohttp.ClientSession, t0: float) -> str:
        t = time.monotonic() - t0
        text = await _get(session, self.base + "/metrics")
        values = {}
        for line in text.splitlines():
            if re.match(FOLLOW[self.engine], line):
                key, _, value = line.rpartition(" ")
                # the sampler's sed: engine and model labels dropped
                key = re.sub(r'\{engine="0",model_name="[^"]*"\}', "", key)
                key = re.sub(r'model_name="[^"]*",?', "", re.sub(r'engine="0",', "", key))
                values[key] = value
        # the real sampler's /slots part printed nothing (its inline Python did not parse), so none here
        return rec.timeline_line(t, time.monotonic() - t0, values)

    async def stream_request(self, path: str, body: dict, after_events: int | None = None,
                             after_s: float | None = None) -> tuple[bytes, list[tuple[float, bytes]]]:
        """A raw-socket POST as the capture's stream_request: each chunk as it arrives, the socket
        closed after `after_events` SSE events or `after_s` seconds if given."""
        data = json.dumps(body).encode()
        reader, writer = await asyncio.open_connection(self.host, int(self.port))
        writer.write((f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                      f"Accept: text/event-stream\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
                     + data)
        t0 = time.monotonic()
        raw, chunks = b"", []
        try:
            while True:
                left = None if after_s is None else after_s - (time.monotonic() - t0)
                if left is not None and left <= 0:
                    break
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), timeout=left if left is not None else 60)
                except TimeoutError:
                    break
                if not chunk:
                    break
                raw += chunk
                chunks.append((time.monotonic() - t0, chunk))
                if after_events is not None and raw.count(b"data:") >= after_events:
                    break
        finally:
            writer.close()
        return raw, chunks


class _Sampler:
    """Samples the followed series every 100 ms (scaled) while the block runs, as sampler.sh did."""

    def __init__(self, scenario: Scenario, session: aiohttp.ClientSession) -> None:
        self.scenario, self.session, self.lines = scenario, session, []
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> list[str]:
        t0 = time.monotonic()

        async def run() -> None:
            while True:
                self.lines.append(await self.scenario.sample(self.session, t0))
                await asyncio.sleep(0.1 * self.scenario.scale)
        self.task = asyncio.create_task(run())
        return self.lines

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        self.lines.append(await self.scenario.sample(self.session, time.monotonic()))
