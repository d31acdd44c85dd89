"""The local actuator starting and stopping real llama-server replicas under the autoscaler:
scale from zero through the hold, and a drain that lets a stream finish before the stop."""

from __future__ import annotations

import json
import os
import shlex

import aiohttp
import pytest

from proxy.autoscale import AutoscaleConfig, HoldSettings
from tests.interop.engines import MODEL_NAME, InteropCache
from tests.proxy.autoscale.fleet import autoscaled_proxy
from tests.proxy.autoscale.test_local import wait_members_gone
from tests.waiting import wait_until

# One decision every 3 s over the last 3 s of arrivals: a request in that window asks for one
# replica (ceil((1 / 3) / (0.8 x 1))), an empty window for none; 3 s of cooldown before a scale-down.
POLICY = "seed:capacity_rps=1,interval_s=3,scale_down=true,scale_down_cooldown_s=3"
STREAM = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "tell a story"}], "max_tokens": 1500,
          "ignore_eos": True, "stream": True}


def engine_cmd(cache: InteropCache) -> str:
    """A real llama-server on the 70M model: a load phase (503 "Loading model") the hold must
    wait through, and a stream long enough to be in flight when the scale-down comes."""
    return shlex.join([str(cache.llama_server), "-m", str(cache.slow_gguf), "--alias", MODEL_NAME, "--metrics",
                       "-np", "2", "-c", "4096", "-t", "1", "-tb", "1"])


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


async def test_scale_from_zero_holds_the_request_until_a_real_llama_server_serves_it_then_drains_and_stops(
        interop_cache: InteropCache, tmp_path):
    if interop_cache.missing_llama():
        pytest.skip(f"real engines absent ({', '.join(interop_cache.missing_llama())}): run `make interop`")
    config = AutoscaleConfig(policy=POLICY, engine_cmd=engine_cmd(interop_cache), min_replicas=0, max_replicas=2,
                             drain_timeout_s=300, stop_grace_s=10, engine_log_dir=tmp_path,
                             hold=HoldSettings(max_requests=8, max_wait_s=300, keepalive_s=1))
    async with autoscaled_proxy(config) as fleet, aiohttp.ClientSession() as session:
        scaler = fleet.runtime.autoscaler
        await wait_until(lambda: scaler.decisions, what="the first decision")
        assert scaler.replicas == {}, "min 0 and no traffic: nothing runs"
        seen = {"draining_while_streaming": False, "alive_at_end": False}
        async with session.post(fleet.url + "/v1/chat/completions", json=STREAM) as resp:
            assert resp.status == 200
            events = []
            async for line in resp.content:
                if line.startswith(b"data: "):
                    events.append(line[6:].strip())
                if scaler.launched and any(r.draining_since_s is not None for r in scaler.replicas.values()):
                    seen["draining_while_streaming"] = True
            handle = scaler.launched[0]
            seen["alive_at_end"] = os.path.exists(f"/proc/{handle.pid}") and "llama-server" in cmdline(handle.pid)
        assert events[-1] == b"[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        content = [c for c in chunks if c.get("choices")]
        assert len(content) >= 2 and content[-1]["choices"][0]["finish_reason"] == "length"
        assert len(scaler.launched) == 1, "one replica for one request"
        assert "llama-server" in cmdline(handle.pid) or not os.path.exists(f"/proc/{handle.pid}")
        # drain before stop: the replica was draining while the stream still ran, its process
        # outlived the stream, and after it the actuator stopped it
        story = lambda: (f"decisions {[(d.desired, d.reason_label, d.drain) for d in scaler.decisions[-8:]]}, "  # noqa: E731
                         f"replicas {scaler.replicas}")
        try:
            await wait_until(lambda: not scaler.replicas, 120, what="the fleet back to zero")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {story()}") from None
        assert seen["draining_while_streaming"], "the scale-down drained the replica during the stream"
        assert seen["alive_at_end"], "the replica was not stopped under the stream"
        assert await wait_members_gone(handle.pid) == []
        assert any(d.drain for d in scaler.decisions)
