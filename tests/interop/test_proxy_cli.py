"""`flotilla proxy` (the command, in its own process) in front of all four real engines, a
`flotilla loadgen` trace replay through it, and the proxy's own /metrics afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DATA
from tests.interop.engines import Engine, free_port
from tests.interop.wire import scrape, total
from tests.waiting import wait_until

TRACE = DATA / "traces" / "azure_conv.first50rows.csv"
REPLAYED = 12
"""The trace's first rows; its 14th asks for more context than a llama-server slot has once our
512-token vocabulary has tokenised loadgen's text (6,704 tokens), a 400 that is no proxy matter."""


@pytest.fixture
def proxy_cli(llama_pair, vllm_pair, tmp_path: Path) -> Iterator[tuple[str, list[Engine]]]:
    engines = [*llama_pair, *vllm_pair]
    port = free_port()
    argv = [sys.executable, "-m", "flotilla", "proxy", "--port", str(port), "--policy", "prefix-aware",
            "--scrape-interval-s", "0.25", "--health-interval-s", "0.5",
            *[arg for e in engines for arg in ("--backend", f"{e.flavor}={e.url}")]]
    log = open(tmp_path / "proxy.log", "wb")  # noqa: SIM115  (closed below, after the process)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}", engines
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def test_proxy_metrics_account_for_every_request_of_a_loadgen_replay(proxy_cli, client, tmp_path):
    url, engines = proxy_cli

    async def all_ready() -> bool:
        try:
            return total(await scrape(client, url), "flotilla_backend_state", state="ready") == len(engines)
        except OSError:
            return False

    await wait_until(all_ready, 60, poll_s=0.2, what="the proxy sees all four engines ready")
    out = tmp_path / "run.json"
    loadgen = subprocess.run(
        [sys.executable, "-m", "flotilla", "loadgen", "--target", url, "--trace", str(TRACE), "--speedup", "20",
         "--max-requests", str(REPLAYED), "--output", str(out), "--quiet", "--timeout", "300"],
        capture_output=True, text=True, timeout=600)
    assert loadgen.returncode == 0, loadgen.stderr[-2000:]
    summary = json.loads(out.read_text())["summary"]
    assert summary["num_ok"] == REPLAYED, summary
    metrics = await scrape(client, url)
    assert total(metrics, "flotilla_requests_total", status="200") == REPLAYED
    assert total(metrics, "flotilla_requests_total") == REPLAYED
    for backend, n in summary["requests_per_backend"].items():
        assert total(metrics, "flotilla_requests_total", backend=backend) == n, backend
    assert total(metrics, "flotilla_time_to_first_token_seconds_count") == REPLAYED
    assert total(metrics, "flotilla_request_latency_seconds_count") == REPLAYED
    assert total(metrics, "flotilla_routing_decisions_total", policy="prefix-aware") == REPLAYED
    assert total(metrics, "flotilla_retries_total") == 0
    assert total(metrics, "flotilla_backend_ejections_total") == 0
    # the engines' usage: what the loadgen counted is what the engines reported
    assert summary["total_completion_tokens"] > 0
    assert total(metrics, "flotilla_prefix_cache_observed_tokens_total") == summary["total_cached_tokens"]
