"""GET /admin/debug: the proxy process's resident memory, open file descriptors and asyncio task
count (what a soak test watches for leaks), behind the admin token."""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from proxy.admin import check_token

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size now (Linux /proc), else the peak from getrusage."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def process_figures() -> dict[str, int]:
    return {"rss_bytes": rss_bytes(), "open_fds": open_fds(), "asyncio_tasks": len(asyncio.all_tasks())}


def debug_route(token: str | None, extra: Callable[[], dict[str, int]]) -> web.RouteDef:
    """The route; `extra` adds the proxy's own counters (queued requests and the like)."""

    async def debug(request: web.Request) -> web.Response:
        check_token(request, token)
        return web.json_response({**process_figures(), **extra()})

    return web.get("/admin/debug", debug)
