"""The simulated fleet: deterministic, refuses what a live start would refuse."""

import pytest

from fake_engines.vllm.engine import ModelDoesNotFit
from flotilla.testing.simulated import SimFleet
from flotilla.testing.spec import FleetSpec
from policies.routing.registry import UnknownPolicyError

WORKLOAD = "poisson:rate=20,duration=3,input=uniform:50:400,output=uniform:4:40"


async def test_the_same_spec_and_workload_replay_to_identical_results():
    spec = FleetSpec(engines=3, policy="power-of-two", seed=5)
    first = await (await SimFleet.start(spec)).replay(WORKLOAD, seed=2)
    again = await (await SimFleet.start(spec)).replay(WORKLOAD, seed=2)
    assert first.to_json() == again.to_json()
    assert first.summary.num_ok == first.summary.num_requests > 40
    assert set(first.summary.requests_per_backend) == {"0", "1", "2"}
    assert (first.meta["source"], first.meta["policy"], first.meta["label"]) == ("sim", "power-of-two", "power-of-two")


async def test_an_slo_gives_goodput_in_modelled_time():
    fleet = await SimFleet.start(FleetSpec(engines=1))
    loose = await fleet.replay(WORKLOAD, slo="e2e=100")
    tight = await fleet.replay(WORKLOAD, slo="ttft=0.001")
    assert loose.summary.goodput_per_s == pytest.approx(loose.summary.request_throughput_per_s)
    assert tight.summary.goodput_per_s == 0.0


async def test_an_unknown_policy_or_a_model_that_does_not_fit_fails_at_start():
    with pytest.raises(UnknownPolicyError):
        await SimFleet.start(FleetSpec(policy="fastest"))
    with pytest.raises(ModelDoesNotFit, match="out of memory"):
        await SimFleet.start(FleetSpec(model="llama-3.1-70b", gpu="rtx4090"))


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
async def test_decode_runs_leave_the_simulated_fleets_results_as_step_by_step(flavor: str, monkeypatch):
    from sim import build

    spec = FleetSpec(engines=2, flavor=flavor, policy="least-outstanding", seed=3,
                     gpu="h100" if flavor == "vllm" else "rtx4090")
    fast = await (await SimFleet.start(spec)).replay(WORKLOAD, seed=4)
    make = build.engine_replica

    def stepping(*args, **kwargs):
        replica = make(*args, **kwargs)
        replica.runs = False
        return replica

    monkeypatch.setattr(build, "engine_replica", stepping)
    slow = await (await SimFleet.start(spec)).replay(WORKLOAD, seed=4)
    assert fast.meta.pop("events") < slow.meta.pop("events")
    assert fast.to_json() == slow.to_json()
