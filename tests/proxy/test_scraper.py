import time

import aiohttp

from tests.proxy.conftest import BackendFactory, ProxyFactory
from tests.proxy.test_engine_metrics import page
from tests.waiting import wait_until


async def test_scraper_keeps_fresh_engine_signals_with_their_age(fake_backend: BackendFactory,
                                                                 proxy_for: ProxyFactory) -> None:
    vllm = await fake_backend("vllm", metrics_text=page("vllm/071_concurrency_nonstream_metrics_snapshot_during_load.txt"))
    llama = await fake_backend("llama", metrics_text=page("llama.cpp/079_concurrency_nonstream_metrics_snapshot_during_load.txt"))
    bare = await fake_backend("bare")  # no /metrics at all
    p = await proxy_for([vllm, llama, bare])
    views = await wait_until(lambda: _scraped(p, 0, 1), what="both engines' pages scraped")
    assert (views[0].num_requests_running, views[0].num_requests_waiting) == (2.0, 3.0)
    assert views[0].cache_capacity_tokens == 2097152
    assert (views[1].num_requests_running, views[1].num_requests_waiting) == (1.0, 0.0)
    assert views[2].num_requests_waiting is None and views[2].metrics_age_s is None
    assert 0 <= views[0].metrics_age_s < 1.0
    async with aiohttp.ClientSession() as s:
        async with s.get(p.url + "/metrics") as r:
            text = await r.text()
    assert f'flotilla_backend_scrape_age_seconds{{backend="{vllm.url}"}}' in text
    assert f'flotilla_backend_scrape_age_seconds{{backend="{bare.url}"}}' not in text


async def test_a_scrape_that_stops_answering_leaves_the_sample_aging(fake_backend: BackendFactory,
                                                                     proxy_for: ProxyFactory) -> None:
    b = await fake_backend(metrics_text="# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 7\n")
    p = await proxy_for([b])
    await wait_until(lambda: _scraped(p, 0), what="the first sample")
    b.knobs.metrics_text = ""
    # aging is real time passing: wait until the kept sample is 0.3 s old (a refreshed age never gets there)
    view = await wait_until(lambda: _aged(p, 0.3), what="the kept sample 0.3 s old")
    assert view.num_requests_waiting == 7.0


def _scraped(p, *indexes: int) -> list | None:
    """The pool's views once the backends at `indexes` have a sample, else None."""
    views = p.proxy.pool.views(time.monotonic())
    return views if all(views[i].metrics_age_s is not None for i in indexes) else None


def _aged(p, age_s: float):
    """The first backend's view once its sample is at least `age_s` old, else None."""
    view = p.proxy.pool.views(time.monotonic())[0]
    return view if view.metrics_age_s >= age_s else None
