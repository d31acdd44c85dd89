"""`flotilla proxy` as a real subprocess in front of an in-process backend."""

import asyncio
import signal
import socket
import subprocess
import sys

import aiohttp

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
        url = line.split()[4]
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x"}) as r:
                assert r.status == 200 and r.headers["x-flotilla-backend"] == backend.url
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
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
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
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
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.startswith("flotilla proxy: ") and out.stderr.count("\n") == 1, out.stderr
    assert str(port) in out.stderr and "in use" in out.stderr


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
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
