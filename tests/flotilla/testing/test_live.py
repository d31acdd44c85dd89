"""The live fleet: real engines and proxy on loopback, results in modelled time like the simulator's."""

import asyncio

import aiohttp
import pytest

from flotilla.testing.live import LiveFleet, to_modelled
from flotilla.testing.simulated import SimFleet
from flotilla.testing.spec import FleetSpec
from loadgen.results import RequestRecord
from loadgen.trace import TraceRequest
from policies.routing.registry import UnknownPolicyError
from tests.waiting import wait_until

# four requests two replicas apart: round-robin puts 0 and 2 on replica 0, 1 and 3 on replica 1
REQUESTS = [TraceRequest(timestamp_s=0.5 * i, input_length=200, output_length=6) for i in range(4)]


def test_wall_times_are_divided_by_the_time_scale_and_backends_become_indices():
    rec = RequestRecord(index=3, backend="http://127.0.0.1:9002", scheduled_time_s=0.1, send_time_s=0.11,
                        ttft_s=0.02, itl_s=[0.005, 0.01], tpot_s=0.0075, e2e_s=0.035, ok=True)
    out = to_modelled(rec, 0.05, {"http://127.0.0.1:9001": "0", "http://127.0.0.1:9002": "1"})
    assert (out.backend, out.scheduled_time_s, out.send_time_s, out.ttft_s, out.tpot_s, out.e2e_s) == (
        "1", pytest.approx(2.0), pytest.approx(2.2), pytest.approx(0.4), pytest.approx(0.15), pytest.approx(0.7))
    assert out.itl_s == pytest.approx([0.1, 0.2]) and rec.ttft_s == 0.02  # the client's record is untouched


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
async def test_a_live_replay_matches_the_simulated_one_in_routing_and_tokens_and_is_never_faster(flavor):
    spec = FleetSpec(engines=2, flavor=flavor, policy="round-robin", time_scale=0.2)
    fleet = await LiveFleet.start(spec)
    try:
        live = await fleet.replay(REQUESTS)
    finally:
        await fleet.close()
    sim = await (await SimFleet.start(spec)).replay(REQUESTS)
    assert live.meta["source"] == "live" and live.meta["time_scale"] == 0.2
    assert [r.backend for r in live.requests] == [r.backend for r in sim.requests] == ["0", "1", "0", "1"]
    key = [(r.prompt_tokens, r.completion_tokens, r.ok) for r in live.requests]
    assert key == [(r.prompt_tokens, r.completion_tokens, r.ok) for r in sim.requests]
    # the engines' clocks advance by the modelled step times, so wall time can only add to them
    for lr, sr in zip(live.requests, sim.requests, strict=True):
        assert lr.ttft_s >= 0.95 * sr.ttft_s and lr.e2e_s >= 0.95 * sr.e2e_s
    assert live.summary.requests_per_backend == sim.summary.requests_per_backend == {"0": 2, "1": 2}


async def test_close_stops_every_server_and_a_failed_start_leaves_none_running():
    fleet = await LiveFleet.start(FleetSpec(engines=2))
    urls = [fleet.url, *fleet.engine_urls]
    await fleet.close()
    await fleet.close()  # twice is harmless
    async with aiohttp.ClientSession() as session:
        for url in urls:
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.get(url + "/health")
    with pytest.raises(UnknownPolicyError):
        await LiveFleet.start(FleetSpec(engines=2, policy="fastest"))
    # the two engines started before the proxy refused the policy are stopped, drivers and all
    await wait_until(lambda: [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == [], poll_s=0,
                     what="no task of the failed start left")
