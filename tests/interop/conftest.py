"""The interop suite: Flotilla in front of real llama-server and real vLLM (issue 23).

Every test here carries the `interop` marker and runs only when asked for (`make interop`, which
sets FLOTILLA_INTEROP=1 after building or reusing the engines) and when the cached engines are
there; otherwise it is skipped with the reason, so `make test` neither builds nor waits for them.
Engines are started once per session (vLLM takes a minute to load) and shared; tests that kill
or restart an engine start their own llama-servers, which load in a fraction of a second.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from policies.routing.base import BackendState
from proxy.app import RunningProxy, start_proxy
from proxy.config import BackendSpec, BreakerConfig, HealthConfig, ProxyConfig, RetryConfig, TimeoutConfig
from tests.interop.engines import Engine, InteropCache, llama_engine, vllm_engine
from tests.waiting import wait_until

HERE = Path(__file__).resolve().parent
ENABLE_VAR = "FLOTILLA_INTEROP"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_vllm: an interop test that runs real vLLM (about a minute to "
                                       "start); `-m 'interop and not needs_vllm'` runs the llama-server part")


def needs_vllm(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "vllm_pair" in getattr(item, "fixturenames", ()) or bool(
        {"vllm", "mixed", "vllm_pair"} & {v for v in params.values() if isinstance(v, str)})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder `interop` (and `needs_vllm` where it runs vLLM); skip them
    all unless FLOTILLA_INTEROP=1."""
    mine = [item for item in items if HERE in Path(str(item.fspath)).resolve().parents]
    skip = None if os.environ.get(ENABLE_VAR) == "1" else pytest.mark.skip(
        reason=f"interop suite against real engines: run `make interop` (sets {ENABLE_VAR}=1; builds or "
               "reuses llama-server and vLLM for CPU under ~/.cache/flotilla/interop)")
    for item in mine:
        item.add_marker(pytest.mark.interop)
        if needs_vllm(item):
            item.add_marker(pytest.mark.needs_vllm)
        if skip is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def interop_cache() -> InteropCache:
    return InteropCache.locate()


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


def _need(missing: list[str], cache: InteropCache) -> None:
    if missing:
        pytest.skip(f"real engines absent ({', '.join(missing)} not under {cache.root}): run `make interop`")


def _start_all(engines: list[Engine]) -> None:
    """Start every engine, then wait for all at once (vLLMs load in parallel)."""
    for engine in engines:
        engine.start()
    try:
        with ThreadPoolExecutor(len(engines)) as pool:
            for future in [pool.submit(e.wait_ready) for e in engines]:
                future.result()
    except BaseException:
        for engine in engines:
            engine.stop()
        raise


@pytest.fixture(scope="session")
def llama_pair(interop_cache: InteropCache, engine_logs: Path) -> Iterator[list[Engine]]:
    """Two real llama-servers serving the tiny GGUF as tiny-llama."""
    _need(interop_cache.missing_llama(), interop_cache)
    engines = [llama_engine(interop_cache, f"llama-{i}", engine_logs) for i in range(2)]
    _start_all(engines)
    yield engines
    for engine in engines:
        engine.stop()


@pytest.fixture(scope="session")
def vllm_pair(interop_cache: InteropCache, engine_logs: Path) -> Iterator[list[Engine]]:
    """Two real vLLMs serving the tiny model as tiny-llama; vllm-0 also serves LoRA adapter lora-a
    and publishes its KV-cache events (`kv_events_endpoint`), vllm-1 serves lora-b."""
    _need(interop_cache.missing_vllm(), interop_cache)
    engines = [vllm_engine(interop_cache, "vllm-0", engine_logs, adapter="lora-a",
                           kv_events=kv_events_endpoint(engine_logs)),
               vllm_engine(interop_cache, "vllm-1", engine_logs, adapter="lora-b")]
    _start_all(engines)
    yield engines
    for engine in engines:
        engine.stop()


def kv_events_endpoint(engine_logs: Path) -> str:
    return f"ipc://{engine_logs / 'vllm-0-kv-events.sock'}"


@pytest.fixture
def own_llamas(interop_cache: InteropCache, engine_logs: Path) -> Iterator[Callable[..., Engine]]:
    """Llama-servers of the test's own (it may kill them); stopped at its end. Not started yet."""
    _need(interop_cache.missing_llama(), interop_cache)
    made: list[Engine] = []

    def make(name: str, **kwargs: object) -> Engine:
        engine = llama_engine(interop_cache, name, engine_logs, **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.stop()


def interop_config(engines: list[Engine], **overrides: object) -> ProxyConfig:
    """A proxy on a free port in front of `engines`, with timeouts sized for CPU engines on a busy
    machine and a breaker quick enough to test."""
    base = ProxyConfig(
        port=0, policy="round-robin", backends=[BackendSpec(url=e.url, flavor=e.flavor) for e in engines],
        scrape_interval_s=0.25,
        timeouts=TimeoutConfig(connect_s=2.0, first_byte_s=120.0, idle_s=60.0, total_s=300.0),
        retry=RetryConfig(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.1, max_retry_after_s=0.5),
        breaker=BreakerConfig(failure_threshold=3, success_threshold=1, open_s=1.0),
        health=HealthConfig(interval_s=0.25, timeout_s=5.0),
    )
    return replace(base, **overrides)


ProxyFactory = Callable[..., Awaitable[RunningProxy]]


async def wait_all_ready(running: RunningProxy, timeout_s: float = 60.0) -> None:
    await wait_until(lambda: all(b.state is BackendState.READY for b in running.proxy.pool),
                     timeout_s, poll_s=0.05, what="every backend ready in the proxy")


@pytest.fixture
async def proxy_in_front() -> AsyncIterator[ProxyFactory]:
    """`await make(engines, policy=..., ready=True, **config overrides)`: an in-process proxy, the
    same application `flotilla proxy` serves, waited on until it sees every engine ready."""
    started: list[RunningProxy] = []

    async def make(engines: list[Engine], ready: bool = True, **overrides: object) -> RunningProxy:
        running = await start_proxy(interop_config(engines, **overrides), rng=random.Random(7))
        started.append(running)
        if ready:
            await wait_all_ready(running)
        return running

    yield make
    for running in started:
        await running.close()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield session
