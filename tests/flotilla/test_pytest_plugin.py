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
