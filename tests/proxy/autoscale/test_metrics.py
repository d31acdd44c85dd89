"""The autoscaler's series on the proxy's /metrics: the names the dashboards query, every
decision reason from zero, replicas by state, and an exposition promtool accepts."""

from __future__ import annotations

import shutil
import subprocess

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from policies.scaling.observe import REASON_LABELS
from proxy.autoscale import AutoscaleConfig, HoldSettings
from tests.proxy.autoscale.fleet import TIME_SCALE, autoscaled_proxy
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
    assert got["flotilla_autoscaler_desired_replicas", ()] == 1.0
    assert got["flotilla_autoscaler_replicas", (("state", "starting"),)] == 1.0
    assert got["flotilla_autoscaler_replicas", (("state", "ready"),)] == 0.0
    assert got["flotilla_autoscaler_arrivals_total", ()] == 1.0
    assert got["flotilla_autoscaler_hold_rejections_total", ()] == 1.0
    if shutil.which("promtool"):
        out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
