"""The whole fidelity count: a look-alike per capture run, started as the run's engine was, then
every capture of the run replayed (bench.fidelity.replay) and, for the main runs, their error rows
(bench.fidelity.tables), the metric families of their last `/metrics` capture against the
look-alike's `/metrics` after the same requests, and the openai SDK's calls (bench.fidelity.sdk);
then the main runs' recordings made again of look-alikes (bench.fidelity.record) and compared
(bench.fidelity.recordings)."""

from __future__ import annotations

import asyncio
import functools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from bench.fidelity import record, recordings, replay, sdk, tables
from bench.fidelity.items import Item
from fake_engines.vllm.app import RUNTIME_LORA_ENV

LORA_RUN = "vllm/lora"
"""The LoRA capture run's folder, replayed as a run of its own."""

ACCEPTED_METRICS: dict[tuple[str, str], str] = {}
"""(engine, family) -> why the look-alike's family differs on purpose (docs/fidelity.md lists them)."""


def last_metrics_capture(engine: str) -> str:
    """The body of the run's last `/metrics` capture."""
    name = [n for n, _, path in replay.index_rows(engine) if path == "/metrics"][-1]
    return replay.capture_body(engine, name)


async def engine_items(engine: str, base: str) -> list[Item]:
    """Every item of one engine against its look-alike at base, captures first (the others follow
    the state the captured requests leave)."""
    captures = await replay.replay_engine(engine, base)
    statuses = {(engine, name): replay.captured(engine, name)[0] for name, *_ in replay.index_rows(engine)}
    rows = [row for row in tables.error_rows() if row[0] == engine]
    items = captures + tables.error_items(rows, captures, statuses)
    items += tables.metric_items(engine, last_metrics_capture(engine), await _scrape(base), ACCEPTED_METRICS)
    return items + await sdk.sdk_items(engine, base)


async def _scrape(base: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as resp:
        return await resp.text()


@asynccontextmanager
async def _serving(engine: Any, wait: bool) -> AsyncIterator[str]:
    """A started look-alike's base URL (once ready, unless not `wait`); closed on the way out."""
    try:
        if wait:
            await engine.wait_ready()
        yield f"http://127.0.0.1:{engine.port}"
    finally:
        await engine.close()


@asynccontextmanager
async def _vllm(time_scale: float = 0.01, cold_start: bool = False, port: int = 0, wait: bool = True,
                **flags: Any) -> AsyncIterator[str]:
    """A look-alike vLLM started as the capture runs' (`--max-model-len 2048 --max-num-seqs 2`,
    served as tiny-llama) plus `flags`; yields its base URL (once ready, unless not `wait`)."""
    from fake_engines.vllm.config import VllmServeConfig
    from fake_engines.vllm.server import start_vllm

    config = VllmServeConfig(model="llama-3.1-8b", served_model_name="tiny-llama", port=port, time_scale=time_scale,
                             max_model_len=2048, max_num_seqs=2, **flags)
    async with _serving(await start_vllm(config, cold_start=cold_start), wait) as base:
        yield base


@asynccontextmanager
async def _llama(alias: str = "/srv/mdls/tiny.gguf", time_scale: float = 0.01, cold_start: bool = False,
                 port: int = 0, wait: bool = True) -> AsyncIterator[str]:
    """A look-alike llama-server started as the capture runs' (`-np 2 -c 2048 --metrics`); yields its
    base URL (once ready, unless not `wait`)."""
    from fake_engines.llamacpp.config import LlamaServerConfig
    from fake_engines.llamacpp.server import start_llama

    config = LlamaServerConfig(model="llama-3.1-8b-F16.gguf", alias=alias, port=port, time_scale=time_scale,
                               n_parallel=2, n_ctx=2048, metrics=True)
    async with _serving(await start_llama(config, cold_start=cold_start), wait) as base:
        yield base


async def recording_items(engine: str) -> list[Item]:
    """Each recording of the engine's main run against the same recording made of look-alikes
    (bench.fidelity.record), compared as its kind is (bench.fidelity.recordings)."""
    # the real vLLM's CPU backend chose 128-token blocks (the capture's README), so prefix hits fall
    # on the same block boundaries
    ours = await record.record_engine(engine, functools.partial(_vllm, block_size=128) if engine == "vllm" else _llama)
    known = {s for name, kind in recordings.recordings(engine) if kind == "startup"
             for s in recordings.startup_states(recordings.recorded(engine, name))}
    items = []
    for name, kind in recordings.recordings(engine):
        accepted = recordings.ACCEPTED_RECORDINGS.get((engine, name))
        if kind == "log":
            verdict, detail = ("accepted", accepted) if accepted else ("missing", "no comparison")
        elif name not in ours:
            verdict, detail = "missing", "not recorded of the look-alike"
        else:
            detail = recordings.compare(kind, recordings.recorded(engine, name), ours[name], known)
            verdict = "matched" if not detail else "accepted" if accepted else "differs"
            detail = accepted if detail and accepted else detail
        items.append(Item(engine, name, verdict, detail or "", "recording"))
    return items


async def all_items() -> list[Item]:
    """Start a look-alike per capture run as the run's engine was started and count every item.

    The slow-model runs (a 70M model, same flags) are replayed for their request rows only: their
    disconnect and concurrency tests between those rows are timing, which other tests check."""
    items: list[Item] = []
    async with _vllm() as base:
        items += await engine_items("vllm", base)
    async with _vllm() as base:
        items += await replay.replay_engine("vllm/slow-model", base)
    items += await lora_items()
    async with _llama("/srv/mdls/tiny.gguf") as base:
        items += await engine_items("llama.cpp", base)
    for engine in ("vllm", "llama.cpp"):
        items += await recording_items(engine)
    async with _llama("/srv/mdls/tiny-slow.gguf") as base:
        items += await replay.replay_engine("llama.cpp/slow-model", base)
    return items


async def lora_items() -> list[Item]:
    """The LoRA run replayed against a look-alike started as it was (`--enable-lora --max-loras 2
    --max-lora-rank 8 --lora-modules lora-a=...`, runtime adapter updates allowed), its adapter
    directories made here; then the families its last `/metrics` has beyond the main run's
    (`vllm:lora_requests_info`)."""
    with tempfile.TemporaryDirectory() as adapters, _environ(RUNTIME_LORA_ENV, "True"):
        for name in ("lora-a", "lora-b"):
            Path(adapters, name).mkdir()
        async with _vllm(enable_lora=True, max_loras=2, max_lora_rank=8,
                         lora_modules={"lora-a": str(Path(adapters, "lora-a"))}) as base:
            items = await replay.replay_engine(LORA_RUN, base, paths={"/srv/mdls/loras": adapters})
            main_run = tables.exported_families(last_metrics_capture("vllm"))
            return items + tables.metric_items(LORA_RUN, last_metrics_capture(LORA_RUN), await _scrape(base),
                                               ACCEPTED_METRICS, counted=main_run)


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """The variable set while the look-alike is made (vLLM reads VLLM_ALLOW_RUNTIME_LORA_UPDATING so)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def run() -> list[Item]:
    """all_items on a fresh event loop."""
    return asyncio.run(all_items())
