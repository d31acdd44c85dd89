"""The fixtures' factory: fleets from YAML or keywords, all closed when the test ends."""

import aiohttp
import pytest

from flotilla.pytest_plugin import fleets
from flotilla.testing import LiveFleet, SimFleet


async def test_every_live_fleet_is_closed_on_exit_even_when_the_test_fails():
    urls = []
    with pytest.raises(AssertionError, match="the test failed"):
        async with fleets("live") as factory:
            for policy in ("round-robin", "least-outstanding"):
                fleet = await factory(engines=1, policy=policy)
                assert isinstance(fleet, LiveFleet) and fleet.proxy.proxy.config.policy == policy
                urls += [fleet.url, *fleet.engine_urls]
            raise AssertionError("the test failed")
    assert len(set(urls)) == 4
    async with aiohttp.ClientSession() as session:
        for url in urls:
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.get(url + "/health")


async def test_a_fleet_yaml_file_with_keyword_overrides_configures_a_simulated_fleet(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("engines: 3\npolicy: round-robin\nengine_options:\n  max_num_seqs: 2\n")
    async with fleets("sim") as factory:
        fleet = await factory(path, policy="least-outstanding")
        result = await fleet.replay("poisson:rate=10,duration=2,input=32,output=4", seed=9)
    assert isinstance(fleet, SimFleet)
    assert (fleet.spec.engines, fleet.spec.policy, fleet.spec.engine_options) == (
        3, "least-outstanding", {"max_num_seqs": 2})
    assert result.meta["policy"] == "least-outstanding"
    assert set(result.summary.requests_per_backend) == {"0", "1", "2"}


FLEET_FILE = """engines:
  - {name: big, flavor: vllm, model: llama-3.2-1b, gpu: h100, replicas: 2, time_scale: 0.05}
  - {name: small, flavor: llamacpp, model: llama-3.2-1b, gpu: rtx4090, parallel: 2, time_scale: 0.05}
proxy: {policy: round-robin}
slo: {e2e_s: 100}
"""


async def test_a_flotilla_up_fleet_file_runs_live_and_simulated_with_the_same_engines(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_FILE)
    workload = "poisson:rate=4,duration=2,input=32,output=4"
    async with fleets("sim") as simulated, fleets("live") as live:
        sim_fleet = await simulated(fleet=path, policy="least-outstanding")
        live_fleet = await live(fleet=str(path), policy="least-outstanding")
        sim_result = await sim_fleet.replay(workload, seed=1)
        live_result = await live_fleet.replay(workload, seed=1)
    # the proxy's order: fixed groups in file order; every replica's engine config as it resolves
    assert [e["group"] for e in sim_result.meta["engines"]] == ["big", "big", "small"]
    assert sim_result.meta["engines"] == live_result.meta["engines"]
    assert sim_result.meta["policy"] == live_result.meta["policy"] == "least-outstanding"
    assert sim_result.summary.goodput_per_s is not None  # judged by the file's slo
    assert sim_fleet.spec is None and sim_fleet.fleet.engines[1].parallel == 2


async def test_fleetspec_only_settings_are_refused_with_a_fleet_file(tmp_path):
    from flotilla.testing import FleetSpecError

    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_FILE)
    async with fleets("sim") as factory:
        with pytest.raises(FleetSpecError, match="engines"):
            await factory(fleet=path, engines=4)
