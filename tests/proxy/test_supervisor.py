"""Process bookkeeping of `flotilla up`: descendants from /proc, orphans adopted and killed."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from proxy.config import KVEventsSource, parse_fleet
from proxy.fleetfile import load_up_fleet, parse_up_fleet
from proxy.supervisor import Fleet, FleetError, descendants_of, proxy_fleet_file, wait_ready

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, uses prctl")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_descendants_include_grandchildren() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    found: list[int] = []
    try:
        # The shell's child is a copy of the shell until it has exec'd sleep: wait for that.
        deadline = time.monotonic() + 30
        while not (found and _cmdline(found[0]).startswith(b"sleep")) and time.monotonic() < deadline:
            time.sleep(0.02)
            found = descendants_of(proc.pid)
        assert len(found) == 1 and _cmdline(found[0]).startswith(b"sleep"), found
    finally:
        for pid in found:
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


SCRIPT = textwrap.dedent("""
    import os, subprocess, time
    from proxy.supervisor import become_subreaper, descendants_of, kill_stragglers
    assert become_subreaper()
    # The shell starts a sleeper in a new session and exits: the sleeper is orphaned.
    subprocess.run(["sh", "-c", "setsid sleep 60 & echo $!"], stdout=open("pid", "w"), check=True)
    orphan = int(open("pid").read())
    deadline = time.monotonic() + 30  # reparenting is done by the shell's exit; poll all the same
    while orphan not in descendants_of(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.02)
    print("adopted", orphan in descendants_of(os.getpid()))
    kill_stragglers([], set())
    print("alive", os.path.exists(f"/proc/{orphan}"))
""")


def test_an_orphan_that_left_its_group_is_adopted_and_killed(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["adopted True", "alive False"]


SMALL_FLEET = "engines:\n  - {flavor: vllm, model: llama-3.2-1b, time_scale: 0.02, load_gbps: 50}\n"


async def _start_and_wait(port: int, log_dir: Path) -> str:
    """The FleetError of starting SMALL_FLEET's proxy on `port` (Fleet.start itself checks no port)."""
    fleet = Fleet(spec=parse_up_fleet(SMALL_FLEET), log_dir=log_dir)
    try:
        await fleet.start(port)
        async with aiohttp.ClientSession() as session:
            with pytest.raises(FleetError) as err:
                await wait_ready(fleet, session, 120, lambda _line: None)
        return str(err.value)
    finally:
        await fleet.stop()


async def test_a_proxy_that_cannot_bind_fails_the_start_with_its_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:  # listens, never answers: only the proxy's exit can end the wait
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = await _start_and_wait(port, tmp_path)
    # the proxy's own one line (flotilla/proxy_cmd.py words it), then where its log is
    assert re.fullmatch(rf"proxy exited while starting: flotilla proxy: .*\b{port}\b.* in use \(log \S+\.log\)",
                        message), message


async def test_another_server_on_the_port_is_never_taken_for_the_proxy(tmp_path: Path) -> None:
    # It answers like a proxy with one ready backend, which is all the fleet waits for, but
    # without this run's instance token.
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text='flotilla_backend_state{backend="http://127.0.0.1:1",state="ready"} 1\n')

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/health", health)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        message = await _start_and_wait(port, tmp_path)
    finally:
        await runner.cleanup()
    # whichever it sees first: the impostor's answer or its own proxy's failed bind
    assert (message.startswith(f"another server answers on port {port}, not the proxy flotilla up started")
            or re.match(rf"proxy exited while starting: flotilla proxy: .*\b{port}\b", message)), message


def test_the_proxys_fleet_file_weighs_every_backend_by_its_groups_capacity(tmp_path: Path) -> None:
    fleet = load_up_fleet()
    vllm, llama = fleet.engines
    data = proxy_fleet_file(fleet, [("llamacpp", "http://127.0.0.1:9001", "llama")], tmp_path)
    assert data["proxy"]["backends"] == [
        {"url": "http://127.0.0.1:9001", "flavor": "llamacpp", "weight": llama.capacity_weight()}]
    assert data["autoscaler"]["weight"] == vllm.capacity_weight()  # the vLLM replicas its autoscaler starts


def test_an_engine_group_publishing_kv_events_gives_its_backends_the_subscription(tmp_path: Path) -> None:
    fleet = load_up_fleet()
    vllm = fleet.engines[0]
    config = ('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:7557", '
              '"replay_endpoint": "tcp://*:7558", "topic": "kv"}')
    group = replace(vllm, args=(*vllm.args, "--kv-events-config", config))
    fleet = replace(fleet, engines=(group, fleet.engines[1]))
    data = proxy_fleet_file(fleet, [("vllm", "http://127.0.0.1:9001", group.name)], tmp_path)
    backend = parse_fleet(yaml.safe_dump(data)).backends[0]
    assert backend.kv_events == KVEventsSource("tcp://127.0.0.1:7557", "tcp://127.0.0.1:7558", "kv")
    assert proxy_fleet_file(load_up_fleet(), [("vllm", "http://127.0.0.1:9001", vllm.name)])[
        "proxy"]["backends"][0].keys() == {"url", "flavor", "weight"}
