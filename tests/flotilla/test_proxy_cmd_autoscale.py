"""`flotilla proxy --autoscale ...` runs the autoscaler from flags alone, with no fleet file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.waiting import wait_until_sync


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    kids = [int(p) for p in out.stdout.split()]
    return kids + [d for k in kids for d in _descendants(k)]


@pytest.mark.timeout(120)
def test_autoscale_flags_start_a_replica_from_zero_and_sigterm_leaves_no_engine() -> None:
    port = _free_port()
    engine = f"{sys.executable} -m fake_engines.vllm.cli serve llama-3.1-8b --time-scale 0.05 --load-gbps 1000"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flotilla", "proxy", "--port", str(port), "--autoscale", "seed",
         "--engine-cmd", engine, "--min-replicas", "0", "--max-replicas", "2", "--autoscale-interval-s", "1",
         "--hold-max-wait-s", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
                time.sleep(0.2)
        # no replica yet: the request is held through a cold start, then served
        body = _post(f"http://127.0.0.1:{port}/v1/completions",
                     {"model": "llama-3.1-8b", "prompt": "Hello", "max_tokens": 4})
        assert body["usage"]["completion_tokens"] == 4
        engines = _descendants(proc.pid)
        assert engines, "the local actuator started no engine process"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    wait_until_sync(lambda: _alive(engines) == [], what=f"the engines {engines} gone after the proxy's exit")


def _alive(pids: list[int]) -> list[int]:
    """The pids still running (neither gone nor a zombie)."""
    alive = []
    for pid in pids:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
        except OSError:
            pass
    return alive


def _engines(pid: int) -> list[int]:
    """The engine processes under `pid` (not the workers, nor a watchdog)."""
    engines = []
    for child in _descendants(pid):
        try:
            argv = open(f"/proc/{child}/cmdline").read().split("\0")
        except OSError:
            continue
        if argv[1:3] == ["-m", "fake_engines.vllm.cli"]:
            engines.append(child)
    return _alive(engines)


def _completion(url: str) -> tuple[str, int]:
    """One completion on a new connection: the worker that answered and the tokens it decoded."""
    req = urllib.request.Request(url + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "llama-3.1-8b", "prompt": "Hello", "max_tokens": 4}).encode())
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.headers["x-flotilla-worker"], json.loads(resp.read())["usage"]["completion_tokens"]


def _leader(url: str) -> int:
    """The leader's pid on /metrics; 0 while none is named or the connection landed on a dead
    worker's socket (reset: docs/proxy.md#workers)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return 0
    leaders = [line for line in text.splitlines() if line.startswith("flotilla_proxy_leader{") and line.endswith(" 1.0")]
    return int(leaders[0].split('pid="')[1].split('"')[0]) if leaders else 0


@pytest.mark.timeout(180)
def test_two_workers_scale_from_zero_through_the_leader_and_a_new_leader_scales_without_orphans() -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    engine = f"{sys.executable} -m fake_engines.vllm.cli serve llama-3.1-8b --time-scale 0.05 --load-gbps 1000"
    # seed plans 1.6 req/s per replica by default: the loop below, a request after another until
    # both workers have answered, can pass that on a fast machine and rightly ask for a second
    # replica. At 100 req/s per replica any rate here wants one, so two engines mean a double start.
    proc = subprocess.Popen(
        [sys.executable, "-m", "flotilla", "proxy", "--port", str(port), "--workers", "2",
         "--autoscale", "seed:capacity_rps=100",
         "--engine-cmd", engine, "--min-replicas", "0", "--max-replicas", "2", "--autoscale-interval-s", "1",
         "--hold-max-wait-s", "60", "--scrape-interval-s", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    engines: list[int] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "2 workers" in line, line
        # no replica yet: whichever worker takes a request holds it while the leader starts one,
        # and both workers then route to that replica
        answered: set[str] = set()
        deadline = time.monotonic() + 60
        while len(answered) < 2:
            worker, tokens = _completion(url)
            assert tokens == 4
            answered.add(worker)
            assert time.monotonic() < deadline, f"only worker {answered} answered"
        engines = _engines(proc.pid)
        assert len(engines) == 1, engines
        leader = wait_until_sync(lambda: _leader(url), what="a leader named on /metrics")
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            desired = [x for x in resp.read().decode().splitlines() if x.startswith("flotilla_autoscaler_desired")]
        assert [x.split()[0] for x in desired] == ['flotilla_autoscaler_desired_replicas{pool="default"}'], desired
        assert engines[0] in _descendants(leader), "the engine is not the leader's child"
        # the leader dies: its engine goes with it, and the new leader scales from zero again
        os.kill(leader, signal.SIGKILL)
        wait_until_sync(lambda: _alive(engines) == [], what=f"the dead leader's engine {engines} gone")
        wait_until_sync(lambda: _leader(url) not in (0, leader), what="another worker leading")
        assert _completion(url)[1] == 4
        engines = _engines(proc.pid)
        assert len(engines) == 1 and engines[0] in _descendants(_leader(url)), engines
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    wait_until_sync(lambda: _alive(engines) == [], what=f"the engines {engines} gone after the proxy's exit")
