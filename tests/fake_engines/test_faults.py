"""Fault injection in both look-alikes: by start-up setting and by POST /admin/faults."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from fake_engines.driver.faults import CRASH_EXIT_STATUS, FaultConfig, FaultConfigError, FaultInjector
from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from tests.conftest import REPO, Serve
from tests.waiting import wait_until

BODY = {"model": "m", "prompt": "hello there", "max_tokens": 8, "ignore_eos": True}


def _vllm_config(**overrides) -> VllmServeConfig:
    base = {"model": "llama-3.1-8b", "served_model_name": "m", "port": 0, "time_scale": 0.01, "max_model_len": 4096}
    return VllmServeConfig(**{**base, **overrides})


def _llama_config(**overrides) -> LlamaServerConfig:
    base = {"model": "llama-3.1-8b-Q4_K_M.gguf", "port": 0, "time_scale": 0.01, "n_parallel": 2}
    return LlamaServerConfig(**{**base, **overrides})


@pytest.fixture
def engine(serve: Serve):
    """start(kind, faults=FaultConfig, api_key=None) -> base URL; kind is vllm or llama."""

    async def start(kind: str, faults: FaultConfig | None = None, **config) -> str:
        injector = FaultInjector(faults, api_key=config.get("api_key"))
        if kind == "vllm":
            return await serve(start_vllm(_vllm_config(**config), cold_start=False, faults=injector))
        return await serve(start_llama(_llama_config(**config), cold_start=False, faults=injector))

    return start


async def _post(session: aiohttp.ClientSession, url: str, body: dict, timeout_s: float = 10.0) -> tuple[int, str]:
    async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        return resp.status, await resp.text()


async def _refuses(base: str) -> bool:
    """Whether the engine's port refuses connections (it exited, or refuses on purpose)."""
    async with aiohttp.ClientSession() as s:
        try:
            await _post(s, base + "/health", {})
        except aiohttp.ClientConnectorError:
            return True
        except aiohttp.ClientError:  # still shutting down: connected, then cut
            return False
    return False


async def _serves(base: str) -> bool:
    """Whether a completion is answered 200."""
    async with aiohttp.ClientSession() as s:
        try:
            return (await _post(s, base + "/v1/completions", BODY))[0] == 200
        except aiohttp.ClientError:
            return False


@pytest.mark.parametrize("kind", ["vllm", "llama"])
async def test_error_rate_one_answers_every_generation_with_the_status_and_retry_after(engine, kind):
    base = await engine(kind, FaultConfig(error_status=503, error_rate=1.0))
    async with aiohttp.ClientSession() as s:
        async with s.post(base + "/v1/completions", json=BODY) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "1"
            assert (await resp.json())["error"]["code"] == 503
        async with s.get(base + "/health") as resp:
            assert resp.status == 200  # only generation requests fail


async def test_error_rate_draw_is_seeded_and_near_the_rate(engine):
    base = await engine("vllm", FaultConfig(error_status=429, error_rate=0.5, seed=3))
    async with aiohttp.ClientSession() as s:
        statuses = [(await _post(s, base + "/v1/completions", BODY))[0] for _ in range(40)]
    import random
    rng = random.Random(3)
    expected = [429 if rng.random() < 0.5 else 200 for _ in range(40)]
    assert statuses == expected
    assert 10 <= statuses.count(429) <= 30


@pytest.mark.parametrize("kind", ["vllm", "llama"])
async def test_admin_endpoint_sets_and_clears_faults(engine, kind):
    base = await engine(kind)
    async with aiohttp.ClientSession() as s:
        async with s.post(base + "/admin/faults", json={"error_status": 500, "error_rate": 1.0}) as resp:
            assert resp.status == 200
        assert (await _post(s, base + "/v1/completions", BODY))[0] == 500
        async with s.post(base + "/admin/faults", json={}) as resp:
            assert resp.status == 200
        assert (await _post(s, base + "/v1/completions", BODY))[0] == 200
        async with s.get(base + "/admin/faults") as resp:
            assert (await resp.json())["error_rate"] == 0.0


async def test_admin_endpoint_rejects_unknown_faults_and_bad_values_with_400(engine):
    base = await engine("vllm")
    async with aiohttp.ClientSession() as s:
        for body in ({"explode": True}, {"error_status": 418}, {"error_rate": 2}, {"slow_factor": 0}):
            async with s.post(base + "/admin/faults", json=body) as resp:
                assert resp.status == 400
                assert "error" in await resp.json()


async def test_admin_endpoint_needs_the_engine_api_key_when_one_is_set(engine):
    base = await engine("vllm", api_key="sekrit")
    async with aiohttp.ClientSession() as s:
        async with s.post(base + "/admin/faults", json={"hang": True}) as resp:
            assert resp.status == 401
        async with s.post(base + "/admin/faults", json={"hang": False},
                          headers={"Authorization": "Bearer sekrit"}) as resp:
            assert resp.status == 200


@pytest.mark.parametrize("kind", ["vllm", "llama"])
async def test_hang_accepts_and_never_answers(engine, kind):
    base = await engine(kind, FaultConfig(hang=True))
    async with aiohttp.ClientSession() as s:
        with pytest.raises(TimeoutError):
            await _post(s, base + "/v1/completions", BODY, timeout_s=0.5)
        with pytest.raises(TimeoutError):
            async with s.get(base + "/health", timeout=aiohttp.ClientTimeout(total=0.5)):
                pass


@pytest.mark.parametrize("kind", ["vllm", "llama"])
async def test_exit_after_requests_serves_n_then_drops_and_refuses(engine, kind):
    base = await engine(kind, FaultConfig(exit_after_requests=2))
    async with aiohttp.ClientSession() as s:
        assert (await _post(s, base + "/v1/completions", BODY))[0] == 200
        assert (await _post(s, base + "/v1/completions", BODY))[0] == 200
        with pytest.raises(aiohttp.ClientError):
            await _post(s, base + "/v1/completions", BODY)
    await wait_until(lambda: _refuses(base), what="the engine's port closed after its last request")


async def test_exit_at_time_crashes_the_engine(engine):
    base = await engine("llama", FaultConfig(exit_at_s=0.2))
    async with aiohttp.ClientSession() as s:
        assert (await _post(s, base + "/v1/completions", BODY))[0] == 200
    await wait_until(lambda: _refuses(base), what="the engine exited at its exit time")


@pytest.mark.parametrize("kind", ["vllm", "llama"])
async def test_drop_after_tokens_cuts_the_stream_after_k_events(engine, kind):
    base = await engine(kind, FaultConfig(drop_after_tokens=3))
    body = {**BODY, "max_tokens": 20, "stream": True}
    received = bytearray()
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(base + "/v1/completions", json=body) as resp:
                async for chunk in resp.content.iter_any():
                    received += chunk
    assert received.count(b"data: ") == 3
    assert b"[DONE]" not in received


async def test_slow_factor_stretches_step_time(engine):
    base = await engine("vllm", time_scale=0.2)
    body = {**BODY, "max_tokens": 32}
    async with aiohttp.ClientSession() as s:
        plain_s = float("inf")
        for _ in range(2):  # the quicker of two: the first request also pays one-off costs (connection, warm-up)
            t0 = time.monotonic()
            await _post(s, base + "/v1/completions", body)
            plain_s = min(plain_s, time.monotonic() - t0)
        async with s.post(base + "/admin/faults", json={"slow_factor": 10}) as resp:
            assert resp.status == 200
        t0 = time.monotonic()
        await _post(s, base + "/v1/completions", body)
        slow_s = time.monotonic() - t0
    assert slow_s > 4 * plain_s


@pytest.mark.parametrize("kind", ["vllm", "llama"])
async def test_refuse_closes_the_port_then_listens_again(engine, kind):
    base = await engine(kind, FaultConfig(refuse_s=0.3))
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientConnectorError):
            await _post(s, base + "/v1/completions", BODY)
    await wait_until(lambda: _serves(base), what="the engine listening again after refusing for 0.3 s")


async def test_slow_start_factor_lengthens_the_cold_start():
    config = _vllm_config(time_scale=0.05, startup_s=5.0, warmup_s=0.0, load_gbps=1000.0)
    plain = await start_vllm(config)
    slow = await start_vllm(config, faults=FaultInjector(FaultConfig(slow_start_factor=5.0)))
    try:
        t0 = time.monotonic()
        await plain.wait_ready()
        plain_s = time.monotonic() - t0
        await slow.wait_ready()
        slow_s = time.monotonic() - t0
        assert slow_s > 3 * plain_s
    finally:
        await plain.close()
        await slow.close()


def test_fault_config_names_the_bad_field():
    with pytest.raises(FaultConfigError) as err:
        FaultConfig(error_rate=-0.1)
    assert err.value.field == "error_rate"


CLI_COMMANDS = {
    "llama": ["fake_engines.llamacpp.cli", "-m", "llama-3.1-8b-Q4_K_M.gguf"],
    "vllm": ["fake_engines.vllm.cli", "serve", "llama-3.1-8b", "--served-model-name", "m"],
}


def _start_cli(kind: str, *flags: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", *CLI_COMMANDS[kind], "--port", "0", "--time-scale", "0.001",
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO, text=True)
    for line in proc.stdout:
        if "http://127.0.0.1:" in line:
            port = int(line.split("http://127.0.0.1:")[1].split()[0])
            break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{kind} never became healthy")


def _completion(port: int) -> urllib.request.Request:
    return urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=b'{"prompt": "x", "max_tokens": 2}',
                                  headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("kind", ["vllm", "llama"])
def test_cli_exit_after_requests_ends_the_process_with_the_crash_status(kind):
    proc, port = _start_cli(kind, "--fault-exit-after-requests", "1")
    try:
        with urllib.request.urlopen(_completion(port), timeout=5) as resp:
            assert resp.status == 200
        with pytest.raises(OSError):
            urllib.request.urlopen(_completion(port), timeout=5)
        assert proc.wait(timeout=10) == CRASH_EXIT_STATUS
    finally:
        proc.kill()
        proc.wait()


def test_cli_error_flags_answer_the_status_at_the_rate():
    proc, port = _start_cli("vllm", "--fault-error-status", "503", "--fault-error-rate", "1")
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(_completion(port), timeout=5)
        assert err.value.code == 503 and err.value.headers["Retry-After"] == "1"
    finally:
        proc.kill()
        proc.wait()


def test_cli_rejects_a_bad_fault_flag_naming_it():
    proc = subprocess.run([sys.executable, "-m", *CLI_COMMANDS["vllm"], "--fault-error-rate", "3"], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == 2 and "error_rate=3.0" in proc.stderr and proc.stderr.count("\n") == 1
