"""A real Prometheus scrapes a running local fleet; every dashboard expression returns data."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from deploy.grafana.build_dashboards import expressions
from proxy.autoscale.local import free_port
from proxy.supervisor import poll_status

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                 reason="prometheus and promtool are installed by make test")]

FLEET = """\
engines:
  - {name: vllm, flavor: vllm, model: llama-3.1-8b, replicas: 2, min: 2, max: 3, time_scale: 0.02, load_gbps: 50}
  - {name: llama, flavor: llamacpp, model: llama-3.1-8b, parallel: 2, time_scale: 0.02, load_gbps: 50}
proxy: {policy: round-robin}
"""
# The vLLM replicas are started by the autoscaler inside the proxy, so its metrics have data.
AUTOSCALER = "autoscaler: {policy: 'cold-start-aware:capacity_rps=2', engines: vllm, interval_s: 1}\n"
EXPRESSIONS = expressions()
METRIC = re.compile(r"\b((?:vllm|llamacpp):[a-z_:]+|flotilla_[a-z_]+)")


def prometheus_config(proxy: str, engines: dict[str, list[str]]) -> dict:
    jobs = [{"job_name": "flotilla", "static_configs": [{"targets": [proxy]}]}]
    jobs += [{"job_name": flavor, "static_configs": [{"targets": targets}]} for flavor, targets in engines.items()]
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": jobs}


async def _wait_line(log: Path, pattern: str, proc: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if re.search(pattern, log.read_text()):
            return log.read_text()
        assert proc.poll() is None, log.read_text()
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {pattern!r}:\n{log.read_text()}")


async def _engine_targets(proxy_url: str) -> dict[str, list[str]]:
    """host:port of every backend the proxy routes to (autoscaled ones too), by flavor."""
    async with aiohttp.ClientSession() as s:
        status = await poll_status(s, proxy_url)
    engines: dict[str, list[str]] = {}
    for b in status.backends:
        engines.setdefault(b.flavor, []).append(b.url.removeprefix("http://"))
    return engines


async def _traffic(s: aiohttp.ClientSession, proxy: str, stop: asyncio.Event) -> None:
    """Requests sharing a long prefix, streamed and not, a few per second."""
    i = 0
    while not stop.is_set():
        body = {"model": "llama-3.1-8b", "prompt": "shared system prompt " * 40 + f"question {i}",
                "max_tokens": 8, "stream": i % 2 == 0}
        async with s.post(f"http://{proxy}/v1/completions", json=body) as r:
            await r.read()
        i += 1
        await asyncio.sleep(0.1)


async def _query(s: aiohttp.ClientSession, prom: str, expr: str) -> list:
    async with s.get(f"{prom}/api/v1/query", params={"query": expr}) as r:
        body = await r.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


async def _wait_scrapes(s: aiohttp.ClientSession, prom: str, targets: int, timeout_s: float = 40.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            up = await _query(s, prom, "count_over_time(up[1m]) and up == 1")
        except aiohttp.ClientError:
            up = []  # Prometheus is still starting
        if len(up) == targets and min(float(r["value"][1]) for r in up) >= 3:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"Prometheus did not scrape {targets} targets 3 times: {up}")


async def test_every_dashboard_expression_returns_data_from_a_live_fleet(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(FLEET + AUTOSCALER)
    log = tmp_path / "up.log"
    with log.open("w") as out:
        up = subprocess.Popen([sys.executable, "-m", "flotilla", "up", str(tmp_path / "fleet.yaml"), "--port", "0",
                               "--log-dir", str(tmp_path / "logs")], stdout=out, stderr=subprocess.STDOUT)
    prom_proc = None
    try:
        text = await _wait_line(log, r"fleet ready in", up, 90)
        proxy = re.search(r"proxy +http://(127\.0\.0\.1:\d+)/v1", text).group(1)
        engines = await _engine_targets(f"http://{proxy}")
        assert set(engines) == {"vllm", "llamacpp"}, engines
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(proxy, engines)))
        check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        prom = f"http://127.0.0.1:{free_port()}"
        prom_proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                      f"--web.listen-address={prom[7:]}"], stdout=subprocess.DEVNULL,
                                     stderr=(tmp_path / "prometheus.log").open("w"))
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as s:
            traffic = asyncio.create_task(_traffic(s, proxy, stop))
            await _wait_scrapes(s, prom, 1 + sum(map(len, engines.values())))
            stop.set()
            await traffic
            exposed = "".join([await (await s.get(f"http://{a}/metrics")).text()
                               for a in [proxy, *sum(engines.values(), [])]])
            empty = []
            for board, title, expr in EXPRESSIONS:
                if not await _query(s, prom, expr):
                    empty.append(f"{board} / {title}: {expr}")
                missing = [m for m in METRIC.findall(expr) if m.removesuffix("_bucket") not in exposed]
                assert not missing, f"{board} / {title} names metrics no target exposes: {missing}"
        assert not empty, "expressions without data:\n" + "\n".join(empty)
    finally:
        if prom_proc is not None:
            prom_proc.terminate()
            prom_proc.wait(30)
        up.send_signal(signal.SIGTERM)
        up.wait(60)

