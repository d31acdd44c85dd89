"""The autoscaler's series on the proxy's /metrics: the names the dashboards query, every
decision reason from zero, replicas by state, and an exposition promtool accepts."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from policies.routing.base import BackendState
from policies.scaling.observe import REASON_LABELS
from proxy.app import build_app
from proxy.autoscale import AutoscaleConfig, HoldSettings, attach
from proxy.autoscale.setup import AutoscaleRuntime
from tests.proxy.autoscale.fleet import TIME_SCALE, autoscaled_proxy
from tests.proxy.conftest import fast_config
from tests.waiting import wait_until

# A replica that never becomes ready, so the fleet stays at one starting replica.
NEVER_READY = "sh -c 'sleep 300' sh"


def series(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics_show_decisions_by_reason_desired_and_replicas_by_state():
    config = AutoscaleConfig(policy="seed:interval_s=20", engine_cmd=NEVER_READY, min_replicas=0,
                             max_replicas=2, time_scale=TIME_SCALE,
                             hold=HoldSettings(max_wait_s=0.3))
    async with autoscaled_proxy(config) as fleet, aiohttp.ClientSession() as session:
        # the first decision, with no traffic yet, comes before the request
        await wait_until(lambda: fleet.runtime.autoscaler.decisions, what="the autoscaler's first decision")
        async with session.post(fleet.url + "/v1/completions", json={"model": "m", "prompt": "hi"}) as resp:
            assert resp.status == 503

        async def scaled_up() -> str | None:
            async with session.get(fleet.url + "/metrics") as resp:
                text = await resp.text()
            return text if series(text).get(("flotilla_autoscaler_replicas", (("state", "starting"),))) else None

        text = await wait_until(scaled_up, what="a replica starting on /metrics")
    got = series(text)
    for reason in REASON_LABELS:
        assert ("flotilla_autoscaler_decisions_total", (("policy", "seed"), ("reason", reason))) in got
    assert got["flotilla_autoscaler_decisions_total", (("policy", "seed"), ("reason", "scale-up"))] == 1.0
    assert got["flotilla_autoscaler_desired_replicas", (("pool", "default"),)] == 1.0
    assert got["flotilla_autoscaler_replicas", (("state", "starting"),)] == 1.0
    assert got["flotilla_autoscaler_replicas", (("state", "ready"),)] == 0.0
    assert got["flotilla_autoscaler_arrivals_total", ()] == 1.0
    assert got["flotilla_autoscaler_hold_rejections_total", ()] == 1.0
    if shutil.which("promtool"):
        out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr


async def _desired(session: aiohttp.ClientSession, url: str, pool: str) -> float | None:
    async with session.get(url + "/metrics") as resp:
        return series(await resp.text()).get(("flotilla_autoscaler_desired_replicas", (("pool", pool),)))


@asynccontextmanager
async def recommending_proxy(backends: list, config: AutoscaleConfig) -> AsyncIterator[tuple[str, AutoscaleRuntime]]:
    """A proxy in front of `backends` on a real socket, its autoscaler in recommend-only mode."""
    app = build_app(fast_config(backends))
    runtime = attach(app, config)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", runtime
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("bounds", "desired"), [({"min_replicas": 3, "max_replicas": 5}, 3.0),
                                                 ({"min_replicas": 1, "max_replicas": 1}, 1.0)])
async def test_recommend_only_exports_the_desired_count_for_its_pool_and_touches_no_replica(
        fake_backend, bounds: dict, desired: float) -> None:
    """Two ready replicas; the policy wants 3 (its floor) or 1 (its ceiling): the count is on
    /metrics labelled with the pool, and the fleet stays as it is for HPA or KEDA to change."""
    backends = [await fake_backend(), await fake_backend()]
    config = AutoscaleConfig(policy="seed:interval_s=1,scale_down=true,scale_down_cooldown_s=0",
                             recommend_only=True, pool="vllm", time_scale=TIME_SCALE, **bounds)
    async with recommending_proxy(backends, config) as (url, runtime), aiohttp.ClientSession() as session:

        async def wanted() -> float | None:
            value = await _desired(session, url, "vllm")
            return value if value == desired else None

        await wait_until(wanted, what=f"flotilla_autoscaler_desired_replicas{{pool=vllm}} {desired} on /metrics")
        decided = runtime.autoscaler.decisions[-1]
        assert decided.desired == desired
        # nothing started or drained: both replicas serve, none was launched
        assert runtime.autoscaler.launched == [] and runtime.autoscaler.replicas == {}
        assert sorted(b.url for b in runtime.pool) == sorted(b.url for b in backends)
        assert all(b.state is BackendState.READY for b in runtime.pool)
        for _ in backends:
            async with session.post(url + "/v1/completions", json={"model": "tiny-llama", "prompt": "hi"}) as resp:
                assert resp.status == 200
