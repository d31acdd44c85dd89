"""The whole fidelity count: both look-alikes started as the real engines were, then, per engine,
every capture replayed (bench.fidelity.replay), its error rows (bench.fidelity.tables), the metric
families of its last `/metrics` capture against the look-alike's `/metrics` after the same requests,
and the openai SDK's calls (bench.fidelity.sdk)."""

from __future__ import annotations

import asyncio

import aiohttp

from bench.fidelity import replay, sdk, tables
from bench.fidelity.items import Item

ACCEPTED_METRICS: dict[tuple[str, str], str] = {}
"""(engine, family) -> why the look-alike's family differs on purpose (docs/fidelity.md lists them)."""


def last_metrics_capture(engine: str) -> str:
    """The body of the engine's last `/metrics` capture of the main run."""
    name = [n for n, _, path, _ in replay.index_rows(engine) if path == "/metrics"][-1]
    raw = (replay.CAPTURES / engine / f"{name}.http").read_text(errors="replace")
    return raw.split("\n\n", 1)[1] if "\n\n" in raw else raw.split("\r\n\r\n", 1)[1]


async def engine_items(engine: str, base: str) -> list[Item]:
    """Every item of one engine against its look-alike at base, captures first (the others follow
    the state the captured requests leave)."""
    captures = await replay.replay_engine(engine, base)
    statuses = {(engine, name): replay.captured(engine, name)[0] for name, *_ in replay.index_rows(engine)}
    rows = [row for row in tables.error_rows() if row[0] == engine]
    items = captures + tables.error_items(rows, captures, statuses)
    async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as resp:
        exported = await resp.text()
    items += tables.metric_items(engine, last_metrics_capture(engine), exported, ACCEPTED_METRICS)
    return items + await sdk.sdk_items(engine, base)


async def all_items() -> list[Item]:
    """Start both look-alikes as the captures' engines were started and count every item."""
    from fake_engines.llamacpp.config import LlamaServerConfig
    from fake_engines.llamacpp.server import start_llama
    from fake_engines.vllm.config import VllmServeConfig
    from fake_engines.vllm.server import start_vllm

    items: list[Item] = []
    vllm = await start_vllm(VllmServeConfig(model="llama-3.1-8b", served_model_name="tiny-llama", port=0,
                                            time_scale=0.01, max_model_len=2048, max_num_seqs=2), cold_start=False)
    try:
        await vllm.wait_ready()
        items += await engine_items("vllm", f"http://127.0.0.1:{vllm.port}")
    finally:
        await vllm.close()
    llama = await start_llama(LlamaServerConfig(model="llama-3.1-8b-F16.gguf", alias="/srv/mdls/tiny.gguf", port=0,
                                                time_scale=0.01, n_parallel=2, n_ctx=2048, metrics=True),
                              cold_start=False)
    try:
        await llama.wait_ready()
        items += await engine_items("llama.cpp", f"http://127.0.0.1:{llama.port}")
    finally:
        await llama.close()
    return items


def run() -> list[Item]:
    """all_items on a fresh event loop."""
    return asyncio.run(all_items())
