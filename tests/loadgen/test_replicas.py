import asyncio
import time

import aiohttp
from aiohttp import web

from loadgen.replicas import poll_replicas, ready_replicas
from tests.waiting import wait_until

EXPOSITION = """\
# HELP flotilla_backend_state 1 for the state each backend is in
# TYPE flotilla_backend_state gauge
flotilla_backend_state{backend="http://127.0.0.1:9001",state="ready"} 1.0
flotilla_backend_state{backend="http://127.0.0.1:9001",state="draining"} 0.0
flotilla_backend_state{backend="http://127.0.0.1:9002",state="ready"} 1.0
flotilla_backend_state{backend="http://127.0.0.1:9003",state="ready"} 0.0
flotilla_backend_state{backend="http://127.0.0.1:9003",state="starting"} 1.0
"""


def test_ready_replicas_counts_backends_in_state_ready():
    assert ready_replicas(EXPOSITION) == 2
    assert ready_replicas("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n") is None


async def test_polling_records_the_count_over_time(aiohttp_server):
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=EXPOSITION)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app, host="127.0.0.1")
    samples: list[tuple[float, int]] = []
    start = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(poll_replicas(session, f"http://127.0.0.1:{server.port}/metrics",
                                                 lambda: time.perf_counter() - start, 0.05, samples))
        await wait_until(lambda: len(samples) >= 3, what="three polls recorded")
        task.cancel()
    assert len(samples) >= 3 and all(n == 2 for _, n in samples)
    assert [t for t, _ in samples] == sorted(t for t, _ in samples)
