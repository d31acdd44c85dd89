"""`flotilla proxy --workers 2` as a real subprocess in front of look-alike vLLM engines: one
address served by two processes that agree on sessions, in-flight work and scrapes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flotilla.fleet import EngineGroup, Fleet
from flotilla.testing.live import LiveFleet
from proxy.config import BackendSpec
from proxy.engine_metrics import LoadSample
from proxy.pool import BackendPool, BackendState
from proxy.shared_load import SharedLoad
from proxy.workers import WORKER_HEADER, AdminJournal, Coordinator
from tests.processes import kill_if_running, terminate
from tests.waiting import wait_until

MODEL = "llama-3.1-8b"


@asynccontextmanager
async def workers_proxy(urls: list[str], policy: str, *extra: str):
    """A 2-worker `flotilla proxy` subprocess; yields its URL once every worker listens."""
    backends = [a for u in urls for a in ("--backend", f"vllm={u}")]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "proxy", "--port", "0", "--workers", "2", "--policy", policy,
        "--scrape-interval-s", "0.1", *backends, *extra, stdout=subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("flotilla proxy listening on http://127.0.0.1:") and "2 workers" in line, line
        yield line.split()[4]
        assert await terminate(proc, 60) == 0
    finally:
        await kill_if_running(proc)


async def metrics(url: str) -> tuple[str, dict[tuple[str, tuple], float]]:
    """One /metrics read on a new connection: the worker that answered and the samples."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        async with s.get(url + "/metrics") as r:
            text = await r.text()
            worker = r.headers[WORKER_HEADER]
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
               for family in text_string_to_metric_families(text) for x in family.samples}
    return worker, samples


def by_backend(samples: dict, name: str) -> dict[str, float]:
    return {dict(labels)["backend"]: v for (n, labels), v in samples.items() if n == name}


async def engine_load(session: aiohttp.ClientSession, url: str) -> float:
    """What the engine itself runs and queues (its own /metrics)."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    return sum(x.value for family in text_string_to_metric_families(text) for x in family.samples
               if x.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))


@pytest.fixture
async def engines():
    group = EngineGroup(flavor="vllm", model=MODEL, name="a", replicas=2, time_scale=5.0)  # slow: a burst stays in flight
    live = await LiveFleet.start(Fleet(engines=(group,), policy="round-robin"))
    yield live.engine_urls
    await live.close()


async def test_a_session_sticks_to_one_backend_through_either_worker(engines) -> None:
    async with workers_proxy(engines, "session-affinity") as url:
        backends: list[str] = []
        workers: set[str] = set()
        while len(backends) < 12 or len(workers) < 2:  # until both workers answered some
            assert len(backends) < 40, f"every request went to worker {workers}"
            # A new connection each time: the kernel spreads connections over the workers.
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                async with s.post(url + "/v1/completions", headers={"x-session-id": "alice"},
                                  json={"model": MODEL, "prompt": f"turn {len(backends)}", "max_tokens": 1}) as r:
                    assert r.status == 200, await r.text()
                    backends.append(r.headers["x-flotilla-backend"])
                    workers.add(r.headers[WORKER_HEADER])
        assert len(set(backends)) == 1 and backends[0] in engines


async def test_metrics_read_through_either_worker_count_every_workers_requests(engines) -> None:
    async with workers_proxy(engines, "round-robin") as url:
        workers: list[str] = []
        while len(workers) < 6 or len(set(workers)) < 2:
            assert len(workers) < 40, f"every request went to worker {workers}"
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                async with s.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}) as r:
                    assert r.status == 200, await r.text()
                    workers.append(r.headers[WORKER_HEADER])

        async def counted(name: str) -> bool:  # each worker folds its tally in every scrape round
            _, samples = await metrics(url)
            return sum(v for (n, _), v in samples.items() if n == name) == len(workers)
        for name in ("flotilla_requests_total", "flotilla_request_latency_seconds_count",
                     "flotilla_routing_decisions_total"):
            await wait_until(lambda name=name: counted(name), what=f"{name} from both workers")


async def test_workers_in_flight_adds_up_to_what_the_engines_run(engines) -> None:
    async with workers_proxy(engines, "least-outstanding") as url, aiohttp.ClientSession() as client:
        async def totals() -> tuple[dict[str, float], dict[str, float]]:
            _, samples = await metrics(url)
            proxy = by_backend(samples, "flotilla_backend_in_flight")
            return proxy, {u: await engine_load(client, u) for u in engines}

        async def agree(expected: float, what: str) -> None:
            last: list = []

            async def check() -> bool:
                proxy, engine = await totals()
                last[:] = [proxy, engine]
                return sum(proxy.values()) == expected and proxy == engine
            try:
                await wait_until(check, what=what)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; proxy, engines: {last}") from None

        streams: list[tuple[aiohttp.ClientSession, aiohttp.ClientResponse]] = []
        try:
            # Each on its own connection, until both workers hold some (the kernel hashes
            # connections over them; 40 all on one would be a 1 in 10^11 draw).
            while len(streams) < 8 or len({r.headers[WORKER_HEADER] for _, r in streams}) < 2:
                assert len(streams) < 40, "every connection went to one worker"
                s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
                r = await s.post(url + "/v1/completions", json={"model": MODEL, "prompt": f"burst {len(streams)}",
                                                              "max_tokens": 5000, "stream": True})
                streams.append((s, r))
                assert r.status == 200
            await agree(len(streams), "the workers' in-flight sum equal to the engines' load")
        finally:
            for s, r in streams:
                r.close()
                await s.close()
        await agree(0, "nothing in flight at rest, by the proxy and by the engines")


async def test_another_worker_takes_over_scraping_when_the_leader_dies(engines) -> None:
    async with workers_proxy(engines, "least-outstanding") as url:
        async def leader() -> str | None:
            try:
                _, samples = await metrics(url)
            except aiohttp.ClientConnectionError:  # queued on the killed worker's socket: reset with it
                return None
            leaders = [dict(labels)["pid"] for (n, labels), v in samples.items()
                       if n == "flotilla_proxy_leader" and v == 1]
            return leaders[0] if len(leaders) == 1 else None

        first = await wait_until(leader, what="one leader")
        os.kill(int(first), signal.SIGKILL)
        second = await wait_until(lambda: _other(leader, first), what="a new leader")
        assert second != first

        async def fresh() -> bool:  # scrapes keep coming, read through whichever worker answers
            _, samples = await metrics(url)
            ages = by_backend(samples, "flotilla_backend_scrape_age_seconds")
            return set(ages) == set(engines) and max(ages.values()) < 1.0

        for _ in range(3):
            await wait_until(fresh, what="fresh scrapes after the hand-over")
            await asyncio.sleep(0.5)  # ages must stay fresh as time passes, not just once


async def test_a_backend_added_or_drained_through_one_worker_is_in_every_workers_pool(engines) -> None:
    token = {"Authorization": "Bearer s3cret"}
    first, second = engines

    async def listings() -> dict[str, set[str]]:
        """Each worker's pool as its own admin API lists it (new connections until both answered)."""
        seen: dict[str, set[str]] = {}
        for _ in range(40):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                async with s.get(url + "/admin/backends", headers=token) as r:
                    assert r.status == 200, await r.text()
                    listed = {b["url"] for b in (await r.json())["backends"] if b["state"] != "draining"}
                    seen[r.headers[WORKER_HEADER]] = listed
            if len(seen) == 2:
                return seen
        raise AssertionError(f"every connection went to one worker: {seen}")

    async with workers_proxy([first], "round-robin", "--admin-token", "s3cret") as url:
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/admin/backends", headers=token, json={"url": second, "flavor": "vllm"}) as r:
                assert r.status == 201, await r.text()

        async def both_route_to_the_new_one() -> bool:
            return all(pool == {first, second} for pool in (await listings()).values())
        await wait_until(both_route_to_the_new_one, what="the added backend in both workers' pools")

        async with aiohttp.ClientSession() as s:
            async with s.delete(url + "/admin/backends", headers=token, params={"url": first}) as r:
                assert r.status == 200, await r.text()

        async def both_dropped_the_old_one() -> bool:
            return all(pool == {second} for pool in (await listings()).values())
        await wait_until(both_dropped_the_old_one, what="the drained backend gone from both workers' pools")


def test_journal_changes_reach_the_other_workers_pool_in_order(tmp_path: Path) -> None:
    async def probe(backend) -> None:
        probed.append(backend.url)
    probed: list[str] = []
    pools = [BackendPool(), BackendPool()]
    one, other = (AdminJournal(tmp_path, pool, probe) for pool in pools)
    b = "http://127.0.0.1:9002"
    for change in ({"op": "add", "backend": {"url": b, "models": ["m"]}}, {"op": "drain", "url": b},
                   {"op": "add", "backend": {"url": b, "models": ["n"]}}):
        with one.held():  # as the admin API does: apply here, then record for the others
            if change["op"] == "add":
                pools[0].add(BackendSpec(url=b, models=tuple(change["backend"]["models"])), source="admin")
            else:
                pools[0].drain(b)
            one.record(change)
    with open(one.path, "ab") as f:
        f.write(b'not json\n{"op": "add", "backend": {"url": 7}}\n')  # skipped, logged; the rest applies
        f.write(b'{"op": "drain", "url"')  # another worker's line, still being written
    other.catch_up()  # outside any loop: applied, the health rounds probe later
    added = pools[1].find(b)
    assert added is not None and added.source == "admin" and added.spec.models == ("n",)
    assert added.state is not BackendState.DRAINING
    with open(one.path, "ab") as f:
        f.write(b': "http://127.0.0.1:9002"}\n')
    other.catch_up()
    assert pools[1].find(b) is None
    one.catch_up()  # its own lines are not applied twice; the other's drain is
    assert pools[0].find(b) is None and probed == []


async def _other(leader, first: str) -> str | None:
    now = await leader()
    return now if now not in (None, first) else None


def test_a_follower_takes_the_leaders_scrapes_and_clears_only_what_they_saw(tmp_path: Path) -> None:
    leader_pool, follower_pool = BackendPool(), BackendPool()
    for pool in (leader_pool, follower_pool):
        pool.add(BackendSpec(url="http://a"))
    leader, follower = Coordinator(tmp_path, leader_pool, 0.1), Coordinator(tmp_path, follower_pool, 0.1)
    assert leader.try_lead() and not follower.try_lead()
    backend = follower_pool.find("http://a")
    follower.follow(now_s=10.0)
    follower_pool.reserve(backend, 100)  # picked in the epoch that started at 10.0
    follower.follow(now_s=11.0)
    follower_pool.reserve(backend, 100)  # picked after 11.0
    leader_pool.find("http://a").sample, leader_pool.find("http://a").sample_time_s = LoadSample(1.0, 0.0), 11.5
    leader.publish()
    follower.follow(now_s=12.0)
    assert backend.sample == LoadSample(1.0, 0.0) and backend.sample_time_s == 11.5
    assert backend.unseen_requests == 1  # the request picked after the scrape was sent


def test_followers_route_to_the_leaders_replicas_and_wake_it_and_a_new_leader_drops_them(tmp_path: Path) -> None:
    leader_pool, follower_pool = BackendPool(), BackendPool()
    leader, follower = Coordinator(tmp_path, leader_pool, 0.1), Coordinator(tmp_path, follower_pool, 0.1)
    assert leader.try_lead() and not follower.try_lead()
    follower_pool.add(BackendSpec(url="http://static"))
    leader_pool.add(BackendSpec(url="http://r1"), source="autoscaler")
    leader_pool.add(BackendSpec(url="http://r2"), source="autoscaler")
    leader.publish()
    follower.follow()
    assert [b.url for b in follower_pool] == ["http://static", "http://r1", "http://r2"]
    leader_pool.drain("http://r1")  # the leader's autoscaler drains a replica
    leader.publish()
    follower.follow()
    assert [b.url for b in follower_pool] == ["http://static", "http://r2"]
    woken: list[bool] = []
    leader.on_wake = lambda: woken.append(True)
    follower.wake()  # a follower holds a request at zero replicas
    leader._take_wake()
    leader._take_wake()
    assert woken == [True]  # once per wake
    follower.drop_scaled()  # leading now: the dead leader's replicas died with it
    assert [b.url for b in follower_pool] == ["http://static"]


def test_the_leaders_policy_counts_every_workers_arrivals_and_held_requests(tmp_path: Path) -> None:
    load = SharedLoad(2, tmp_path / "slots.lock")
    for row, (arrived, held) in enumerate([(5, 1), (7, 2)]):
        load.row = row
        load.publish_counts(arrived, held)
    assert load.total_arrived() == 12 and load.total_held() == 3
    load.zero_row(1)  # worker 1 died: nothing is held there any more, its arrivals stay counted
    assert load.total_arrived() == 12 and load.total_held() == 1
    assert load.arrived() == 7  # its restart goes on from 7, so the total never goes back
