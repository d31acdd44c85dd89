"""`flotilla proxy --autoscale ...` runs the autoscaler from flags alone, with no fleet file."""

from __future__ import annotations

import json
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
