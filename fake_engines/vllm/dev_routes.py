"""Routes that exist only with VLLM_SERVER_DEV_MODE=1, as in vLLM: its `POST /reset_prefix_cache`
(vllm/entrypoints/serve/dev/cache/api_router.py, 0.32.0) and Flotilla's own `GET /debug/kv_cache`,
which lists what the prefix cache holds so a test can compare a router's KV index with it."""

from __future__ import annotations

import os

from aiohttp import web

from fake_engines.core import VllmScheduler
from fake_engines.driver.serving import json_body
from fake_engines.vllm.app import SERVER_KEY, VllmServer

DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"


def dev_mode(environ: dict[str, str] | None = None) -> bool:
    """vLLM's reading of VLLM_SERVER_DEV_MODE: an integer, on unless 0 (anything else: off)."""
    value = (os.environ if environ is None else environ).get(DEV_MODE_ENV, "0").strip()
    try:
        return bool(int(value))
    except ValueError:
        return False


def add_dev_routes(app: web.Application) -> None:
    """Register the dev-mode routes on a fake vLLM app."""
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_get("/debug/kv_cache", debug_kv_cache, allow_head=False)


def _cores(server: VllmServer) -> list[VllmScheduler]:
    cores = [unit.driver.core for unit in server.engines]
    assert all(isinstance(core, VllmScheduler) for core in cores)
    return cores  # type: ignore[return-value]


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM's reset: every engine forgets its cached blocks, only when none is in use
    (`{"success": false}` otherwise); each engine's AllBlocksCleared goes out with its next step.
    `reset_running_requests` and `reset_external` are accepted; running requests are never preempted here."""
    results = [core.reset_prefix_cache() for core in _cores(request.app[SERVER_KEY])]
    return json_body({"success": all(results)})


async def debug_kv_cache(request: web.Request) -> web.Response:
    """The published (external) hashes of the blocks in each engine's prefix cache, sorted."""
    server = request.app[SERVER_KEY]
    config = server.config
    hashes = [core.cached_block_hashes() for core in _cores(server)]
    engines = [{"data_parallel_rank": rank, "block_hashes": held} for rank, held in enumerate(hashes)]
    return json_body({"block_size": config.resolved_block_size,
                      "prefix_caching_hash_algo": config.prefix_caching_hash_algo,
                      "enable_kv_cache_events": bool(config.kv_events_config
                                                     and config.kv_events_config.enable_kv_cache_events),
                      "block_hashes": sorted({h for held in hashes for h in held}),
                      "engines": engines})
