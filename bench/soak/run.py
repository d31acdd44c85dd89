"""A soak run: a look-alike vLLM fleet and a proxy as subprocesses, faults switched on and off on
a schedule, C clients sending for N minutes, the proxy's RSS, fds and tasks sampled throughout."""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.soak.report import CONNECTION_ERROR, NO_ANSWER, Sample, SoakReport, classify

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
ADMIN_TOKEN = "soak-admin-token"
FAULT_CYCLE: tuple[dict, ...] = (
    {"error_status": 503, "error_rate": 0.3},
    {"drop_after_tokens": 3},
    {"hang": True},
    {"refuse_s": 1.0},
    {"slow_factor": 5.0},
    {"error_status": 500, "error_rate": 0.1},
    {"error_status": 429, "error_rate": 0.5},
    {},
)
"""Faults set in turn on the fleet's engines (the first engine stays healthy throughout)."""


@dataclass
class SoakConfig:
    """One soak run."""

    minutes: float
    """How long clients send."""
    concurrency: int = 8
    """Clients, each sending its next request when the last one ended."""
    engines: int = 3
    """Look-alike vLLM replicas behind the proxy."""
    time_scale: float = 0.01
    """The engines' --time-scale."""
    sample_every_s: float = 1.0
    """Seconds between samples of the proxy process."""
    fault_every_s: float = 3.0
    """Seconds between fault changes."""
    request_timeout_s: float = 30.0
    """A client waiting longer counts the request as unanswered."""
    first_byte_timeout_s: float = 2.0
    """The proxy's --first-byte-timeout-s (what a hung engine costs a request)."""
    seed: int = 0
    """Seeds request shapes and the engines' error draws."""

    def __post_init__(self) -> None:
        for name in ("minutes", "concurrency", "engines", "time_scale", "sample_every_s", "fault_every_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be > 0")
        if self.engines < 2:
            raise ValueError(f"engines={self.engines!r}: must be >= 2 (one stays healthy)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


async def wait_ok(session: aiohttp.ClientSession, url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s} s")


def engine_args(port: int, config: SoakConfig, index: int) -> list[str]:
    return ["-m", "fake_engines.vllm.cli", "serve", "llama-3.1-8b", "--served-model-name", MODEL,
            "--port", str(port), "--time-scale", str(config.time_scale), "--seed", str(config.seed + index),
            "--fault-seed", str(config.seed + index)]


def proxy_args(port: int, engine_urls: list[str], config: SoakConfig) -> list[str]:
    backends = [a for url in engine_urls for a in ("--backend", f"vllm={url}")]
    return ["-m", "flotilla", "proxy", *backends, "--port", str(port), "--admin-token", ADMIN_TOKEN,
            "--first-byte-timeout-s", str(config.first_byte_timeout_s), "--health-interval-s", "0.25",
            "--idle-timeout-s", "5"]


async def one_request(session: aiohttp.ClientSession, url: str, rng: random.Random, timeout_s: float) -> str:
    stream = rng.random() < 0.5
    body = {"model": MODEL, "prompt": " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(20)),
            "max_tokens": rng.randint(4, 24), "ignore_eos": True, "stream": stream}
    try:
        async with session.post(url + "/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            try:
                payload = await r.read()
            except aiohttp.ClientPayloadError:
                return "truncated"
            return classify(r.status, payload, stream)
    except TimeoutError:
        return NO_ANSWER
    except aiohttp.ClientError:
        return CONNECTION_ERROR


async def client(session: aiohttp.ClientSession, url: str, seed: int, end_s: float, report: SoakReport,
                 timeout_s: float) -> None:
    rng = random.Random(seed)
    while time.monotonic() < end_s:
        report.sent += 1
        report.outcomes[await one_request(session, url, rng, timeout_s)] += 1


async def sampler(session: aiohttp.ClientSession, url: str, start_s: float, end_s: float, every_s: float,
                  report: SoakReport) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    while time.monotonic() < end_s:
        async with session.get(url + "/admin/debug", headers=headers) as r:
            d = await r.json()
        report.samples.append(Sample(round(time.monotonic() - start_s, 2), d["rss_bytes"], d["open_fds"],
                                     d["asyncio_tasks"]))
        await asyncio.sleep(every_s)


async def set_faults(session: aiohttp.ClientSession, engine_url: str, faults: dict) -> None:
    try:
        async with session.post(engine_url + "/admin/faults", json=faults,
                                timeout=aiohttp.ClientTimeout(total=2)) as r:
            await r.read()
    except (aiohttp.ClientError, TimeoutError):
        pass  # a refusing engine cannot be told; its refusal ends by itself


async def fault_schedule(session: aiohttp.ClientSession, engine_urls: list[str], end_s: float,
                         every_s: float) -> None:
    """Engine 1 + (k mod (n-1)) gets fault k of FAULT_CYCLE; the others are cleared."""
    k = 0
    while time.monotonic() < end_s:
        target = engine_urls[1 + k % (len(engine_urls) - 1)]
        for url in engine_urls[1:]:
            await set_faults(session, url, FAULT_CYCLE[k % len(FAULT_CYCLE)] if url == target else {})
        k += 1
        await asyncio.sleep(every_s)
    for url in engine_urls[1:]:
        await set_faults(session, url, {})


async def run_soak(config: SoakConfig) -> SoakReport:
    engine_ports = [free_port() for _ in range(config.engines)]
    engine_urls = [f"http://127.0.0.1:{p}" for p in engine_ports]
    procs = [spawn(engine_args(p, config, i)) for i, p in enumerate(engine_ports)]
    proxy_port = free_port()
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    report = SoakReport()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            for url in engine_urls:
                await wait_ok(session, url + "/health")
            procs.append(spawn(proxy_args(proxy_port, engine_urls, config)))
            await wait_ok(session, proxy_url + "/ready")
            start_s = time.monotonic()
            end_s = start_s + config.minutes * 60
            await asyncio.gather(
                sampler(session, proxy_url, start_s, end_s, config.sample_every_s, report),
                fault_schedule(session, engine_urls, end_s, config.fault_every_s),
                *(client(session, proxy_url, config.seed * 1000 + i, end_s, report, config.request_timeout_s)
                  for i in range(config.concurrency)))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return report
