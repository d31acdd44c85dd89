"""`flotilla proxy` as a real subprocess in front of an in-process backend."""

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from proxy.build import describe
from tests.processes import kill_if_running, terminate
from tests.proxy.conftest import FakeBackend, Knobs


async def test_flotilla_proxy_serves_and_stops_cleanly_on_sigterm() -> None:
    backend = FakeBackend(name="solo")
    await backend.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "proxy", "--port", "0", "--policy", "round-robin",
        "--backend", f"vllm={backend.url}", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("flotilla proxy listening on http://127.0.0.1:")
        assert line.rstrip().endswith(f", {describe()})")  # the build it runs (the same sys.path as here)
        url = line.split()[4]
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x"}) as r:
                assert r.status == 200 and r.headers["x-flotilla-backend"] == backend.url
        assert await terminate(proc, 30) == 0
    finally:
        await kill_if_running(proc)
        await backend.stop()


async def test_sigterm_lets_a_stream_in_flight_finish() -> None:
    backend = FakeBackend(name="slow", knobs=Knobs(chunks=5, chunk_delay_s=0.2))
    await backend.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "proxy", "--port", "0", "--backend", backend.url,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()[4]
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x", "stream": True}) as r:
                first = await r.content.readuntil(b"\n\n")
                proc.send_signal(signal.SIGTERM)
                rest = await r.read()
        assert b"slow-0" in first and b"slow-4" in rest and rest.endswith(b"data: [DONE]\n\n")
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        await kill_if_running(proc)
        await backend.stop()


def test_unknown_policy_is_a_usage_error_listing_the_valid_ones() -> None:
    out = subprocess.run([sys.executable, "-m", "flotilla", "proxy", "--backend", "http://127.0.0.1:1",
                          "--policy", "no-such"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "round-robin" in out.stderr


def test_bad_backend_flavor_names_the_field() -> None:
    out = subprocess.run([sys.executable, "-m", "flotilla", "proxy", "--backend", "sglang=http://127.0.0.1:1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "flavor" in out.stderr


def test_a_taken_port_is_a_one_line_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "flotilla", "proxy", "--port", str(port),
                              "--backend", "http://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr == f"flotilla proxy: error: port {port} on 127.0.0.1 is in use\n"


def _proxy_fails(*argv: str) -> str:
    """stderr of a `flotilla proxy` that must refuse to start: exit 2, one line, no traceback."""
    out = subprocess.run([sys.executable, "-m", "flotilla", "proxy", *argv], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("flotilla proxy: error: ")
    return out.stderr


@pytest.mark.parametrize("fleet,cause", [
    ("backends:\n  - {url: 'http://127.0.0.1:1', models: 5}\n", "backends[0].models=5: must be"),
    ("backends: [\n  - {url: x\n", "invalid YAML: while parsing a flow node"),
    ("backends:\n  - {url: 'http://127.0.0.1:1', weight: x}\n", "backends[0].weight='x': must be a finite number"),
    ("proxy:\n  backends: 5\n", "proxy.backends=5: must be a list"),
    ("backends: []\nautoscaler: {policy: kpa, interval_s: soon}\n", "autoscaler.interval_s='soon'"),
])
def test_a_bad_fleet_file_is_one_line_naming_the_file_and_the_field(tmp_path: Path, fleet: str, cause: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet)
    err = _proxy_fails("--config", str(path))
    assert str(path) in err and cause in err


def test_a_missing_fleet_file_is_one_line_naming_it(tmp_path: Path) -> None:
    err = _proxy_fails("--config", str(tmp_path / "absent.yaml"))
    assert f"{tmp_path / 'absent.yaml'}: cannot read: No such file or directory" in err


def test_discover_without_a_cluster_configuration_is_one_line_naming_it(tmp_path: Path) -> None:
    err = _proxy_fails("--discover", "vllm=k8s:vllm", "--port", "0", "--kubeconfig", str(tmp_path / "absent"))
    assert "kubernetes: no usable configuration" in err and str(tmp_path / "absent") in err


def test_a_bad_discover_flag_is_one_line_naming_it() -> None:
    assert "source='svc:vllm': must be k8s:SERVICE" in _proxy_fails("--discover", "svc:vllm")


@pytest.mark.parametrize("argv,cause", [
    (["--log-level", "nonsense"], "argument --log-level: invalid level 'nonsense': choose from debug, info"),
    (["--port", "70000"], "argument --port: invalid port 70000: must be in [0, 65535]"),
    (["--port", "http"], "argument --port: invalid port 'http'"),
    (["--host", "192.0.2.1", "--port", "0"], "cannot listen on 192.0.2.1: not an address of this machine (--host)"),
    (["--host", "no-such-host.invalid", "--port", "0"], "cannot listen on no-such-host.invalid: no such host name"),
    (["--workers", "0"], "argument --workers: must be a positive integer or auto, not '0'"),
    (["--workers", "2", "--autoscale", "seed", "--actuator", "docker", "--docker-image", "vllm/vllm-openai"],
     "--workers above 1 autoscales with the local actuator only"),
    (["--workers", "2", "--host", "192.0.2.1", "--port", "0"], "cannot listen on 192.0.2.1: not an address"),
])
def test_a_bad_flag_or_an_unbindable_host_is_one_line_naming_it(argv: list[str], cause: str) -> None:
    assert cause in _proxy_fails("--backend", "http://127.0.0.1:1", *argv)


async def test_the_instance_id_comes_back_on_the_proxys_own_routes() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "proxy", "--port", "0", "--backend", "http://127.0.0.1:1",
        "--instance-id", "run-42", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()[4]
        async with aiohttp.ClientSession() as s:
            for path in ("/health", "/metrics", "/ready", "/no-such-route"):
                async with s.get(url + path) as r:
                    assert r.headers.get("x-flotilla-instance") == "run-42", (path, r.status)
        assert await terminate(proc, 30) == 0
    finally:
        await kill_if_running(proc)
