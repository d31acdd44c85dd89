"""The autoscaler attached to a live proxy with the local actuator and look-alike vLLM replicas,
20 times faster than modelled: a load step grows the fleet, it shrinks after the cooldown, and
every request of the run (streams cut by no drain) ends with status 200."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from policies.scaling.base import ReplicaState
from proxy.autoscale import AutoscaleConfig, config_from_args, config_from_mapping
from proxy.autoscale.setup import build_policy
from proxy.config import ConfigError
from tests.proxy.autoscale.fleet import ENGINE_CMD, TIME_SCALE, autoscaled_proxy
from tests.proxy.autoscale.test_local import wait_members_gone
from tests.waiting import wait_until

# seed rule: desired = ceil(rate / (0.8 x 0.5)), decided every 20 s = 1 s real; 60 s cooldown = 3 s real
POLICY = "seed:capacity_rps=0.5,interval_s=20,scale_down=true,scale_down_cooldown_s=60"
SHORT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "count to three"}], "max_tokens": 16}
LONG_STREAM = {**SHORT, "max_tokens": 400, "stream": True}


async def one_request(session: aiohttp.ClientSession, url: str, body: dict) -> int:
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        payload = await resp.read()
        if resp.status == 200 and body.get("stream"):
            # a stream cut short by a drained replica would end without [DONE]
            return 200 if payload.rstrip().endswith(b"data: [DONE]") else 599
        return resp.status


async def open_loop(session: aiohttp.ClientSession, url: str, body: dict, rps: float, until) -> list[asyncio.Task]:
    """Send `body` at `rps` (real seconds) until `until()` is true; on a schedule, so a busy
    machine sends late requests in a burst rather than fewer of them."""
    loop = asyncio.get_running_loop()
    start, tasks = loop.time(), []
    while not until():
        tasks.append(asyncio.create_task(one_request(session, url, body)))
        await asyncio.sleep(max(0.0, start + len(tasks) / rps - loop.time()))  # the load's own pacing
    return tasks


async def test_a_load_step_grows_the_fleet_which_shrinks_after_the_cooldown_losing_no_request():
    config = AutoscaleConfig(policy=POLICY, engine_cmd=ENGINE_CMD, min_replicas=1, max_replicas=3,
                             time_scale=TIME_SCALE, drain_timeout_s=600)
    async with autoscaled_proxy(config) as fleet, aiohttp.ClientSession() as session:
        scaler = fleet.runtime.autoscaler
        peak = {"ready": 0, "current": 0}

        async def watch() -> None:
            while True:
                state = scaler.fleet_state(scaler.clock.now_s())
                peak["ready"] = max(peak["ready"], state.ready)
                peak["current"] = max(peak["current"], state.current)
                await asyncio.sleep(0.02)  # sampling interval for the whole run, not a wait

        watcher = asyncio.create_task(watch())
        loop = asyncio.get_running_loop()
        await wait_until(lambda: scaler.fleet_state(scaler.clock.now_s()).ready >= 1, what="the first replica ready")
        step_end = loop.time() + 5.0
        tasks = await open_loop(session, fleet.url, SHORT, 20, lambda: loop.time() > step_end)
        grown = peak["current"]
        tail_end = loop.time() + 45.0

        def shrunk() -> bool:
            state = scaler.fleet_state(scaler.clock.now_s())
            return loop.time() > tail_end or (peak["ready"] >= 2 and state.current == 1 and state.draining == 0)

        tasks += await open_loop(session, fleet.url, LONG_STREAM, 2, shrunk)
        statuses = await asyncio.gather(*tasks)
        watcher.cancel()
        final = scaler.fleet_state(scaler.clock.now_s())
        drained = [d for d in scaler.decisions if d.drain]
        survivors = {r.handle.pid for r in scaler.replicas.values()}
        pids = {h.pid for h in scaler.launched}
    story = f"peak {peak}, final {final}, decisions {[(d.desired, d.reason_label, d.drain) for d in drained]}"
    assert grown >= 2 and peak["ready"] >= 2, story
    assert final.current == 1 and final.in_state(ReplicaState.READY), story
    assert drained, "the fleet never shrank"
    assert statuses.count(200) == len(statuses) > 90, sorted(set(statuses))
    for pid in pids - survivors:
        assert await wait_members_gone(pid) == []


def test_flags_and_fleet_file_build_the_config(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("backends: []\nautoscaler:\n  policy: kpa\n  engine_cmd: [fake-vllm, serve, m]\n"
                     "  min: 0\n  max: 4\n  engines: vllm\n  hold: {max_requests: 3}\n")
    import argparse

    from proxy.autoscale import add_arguments

    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_arguments(parser)
    assert config_from_args(parser.parse_args([])) is None
    config = config_from_args(parser.parse_args(["--config", str(fleet), "--max-replicas", "6"]))
    assert (config.policy, config.engine_cmd, config.min_replicas, config.max_replicas) == ("kpa", "fake-vllm serve m", 0, 6)
    assert config.hold.max_requests == 3
    logged = config_from_mapping({"engine_cmd": "x", "engine_log_dir": str(tmp_path / "logs")})
    assert logged.engine_log_dir == tmp_path / "logs"
    policy = build_policy(config)
    assert (policy.limits.min_replicas, policy.limits.max_replicas) == (0, 6)
    args = parser.parse_args(["--autoscale", "seed:capacity_rps=3", "--engine-cmd", "fake-vllm serve m",
                              "--autoscale-interval-s", "5", "--k8s-workload", "deployment/x"])
    policy = build_policy(config_from_args(args))
    assert (policy.name, policy.config.capacity_rps, policy.interval_s) == ("seed", 3.0, 5.0)


@pytest.mark.parametrize("raw, field", [
    ({"actuator": "ssh", "engine_cmd": "x"}, "actuator"),
    ({"actuator": "local"}, "engine_cmd"),
    ({"engine_cmd": "x", "min": -1}, "min_replicas"),
    ({"engine_cmd": "x", "time_scale": 0}, "time_scale"),
    ({"engine_cmd": "x", "colour": "red"}, "autoscaler.colour"),
    ({"engine_cmd": "x", "flavor": "tgi"}, "flavor"),
    ({"engine_cmd": "x", "weight": 0}, "weight"),
    ({"engine_cmd": "x", "weight": "heavy"}, "weight"),
    ({"recommend_only": "yes"}, "autoscaler.recommend_only"),
    ({"recommend_only": True, "pool": 3}, "autoscaler.pool"),
])
def test_bad_settings_name_the_field(raw, field):
    with pytest.raises(ConfigError) as info:
        config_from_mapping(raw)
    assert info.value.field == field



def test_recommend_only_needs_no_engine_command_and_labels_its_pool(tmp_path):
    """The flag and the fleet-file key; the pool label defaults to the Kubernetes workload's name."""
    import argparse

    from proxy.autoscale import add_arguments
    from proxy.autoscale.actuator import ObserveNothing
    from proxy.autoscale.setup import build_actuator

    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_arguments(parser)
    flags = config_from_args(parser.parse_args(["--autoscale", "kpa", "--autoscale-recommend-only"]))
    assert flags.recommend_only and flags.engine_cmd is None and flags.pool_label == "default"
    assert isinstance(build_actuator(flags), ObserveNothing)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("autoscaler:\n  policy: kpa\n  recommend_only: true\n  actuator: kubernetes\n"
                     "  kubernetes: {workload: deployment/vllm, service: vllm}\n")
    from_file = config_from_args(parser.parse_args(["--config", str(fleet)]))
    assert from_file.recommend_only and from_file.pool_label == "vllm"
    named = config_from_args(parser.parse_args(["--config", str(fleet), "--autoscale-pool", "gpus"]))
    assert named.pool_label == "gpus"
    assert config_from_mapping({"policy": "kpa", "engine_cmd": "x"}).recommend_only is False


@pytest.mark.parametrize("spec, words", [("seed:capacity_rps=-1", "capacity_rps"), ("hpa", "valid policies")])
def test_a_bad_policy_spec_fails_when_the_config_is_built(spec, words):
    with pytest.raises(ValueError, match=words):
        config_from_mapping({"policy": spec, "engine_cmd": "x"})
