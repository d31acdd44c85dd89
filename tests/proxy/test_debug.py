"""GET /admin/debug reports this process's RSS, open fds and asyncio tasks, behind the token."""

from __future__ import annotations

import asyncio
import os

import aiohttp

from proxy.debug import open_fds, rss_bytes

TOKEN = "t"


def test_figures_match_the_process():
    assert open_fds() == len(os.listdir("/proc/self/fd"))  # both count the listing descriptor
    with open("/proc/self/status") as f:
        vmrss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    assert abs(rss_bytes() - vmrss_kb * 1024) < 8 * 2**20


async def test_debug_endpoint_reports_the_figures_and_proxy_counters(fake_backend, proxy_for):
    b = await fake_backend()
    p = await proxy_for([b], admin_token=TOKEN)
    async with aiohttp.ClientSession() as s:
        async with s.get(p.url + "/admin/debug", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 200
            d = await r.json()
    assert d["rss_bytes"] > 10 * 2**20 and d["open_fds"] > 3
    assert 1 <= d["asyncio_tasks"] <= len(asyncio.all_tasks()) + 5
    assert d["queued"] == 0 and d["in_flight"] == 0
