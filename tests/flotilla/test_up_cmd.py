"""`flotilla up` as a real subprocess: ready, serving through the proxy, nothing left after SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process checks read /proc")

UP = [sys.executable, "-m", "flotilla", "up", "--port", "0", "--time-scale", "0.02"]


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of a live process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[2])


def _tree(root: int) -> dict[int, int]:
    """Every descendant of `root` -> its process group."""
    table = {int(p.name): _stat(int(p.name)) for p in Path("/proc").glob("[0-9]*")}
    out, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, st in table.items():
            if st is not None and st[1] == parent:
                out[pid] = st[2]
                todo.append(pid)
    return out


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text())
        if found:
            return found
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} within {timeout_s} s:\n{log.read_text()}")


async def test_up_serves_through_the_proxy_and_leaves_no_process_after_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*UP, "--log-dir", str(tmp_path / "logs")], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(log, r"fleet ready in", proc)
        proxy = _wait_for(log, r"proxy +(http://127\.0\.0\.1:\d+)/v1", proc).group(1)
        table = _wait_for(log, r"\n(backend .*\n(?:.*\n){3})3/3 ready, \d+ in flight, [\d.]+ req/s, autoscaler wants 2",
                          proc).group(1)
        # The default fleet: two vLLM replicas started by the proxy's autoscaler, one llama-server by up.
        engines = re.findall(r"(http://127\.0\.0\.1:\d+) +(vllm|llamacpp) +ready ", table)
        assert sorted(f for _, f in engines) == ["llamacpp", "vllm", "vllm"], table
        async with aiohttp.ClientSession() as s:
            body = {"model": "llama-3.1-8b", "prompt": "Hello there", "max_tokens": 5}
            async with s.post(proxy + "/v1/completions", json=body) as r:
                answer = await r.json()
                assert r.status == 200, answer
                assert r.headers["x-flotilla-backend"] in {u for u, _ in engines}
        assert answer["usage"]["completion_tokens"] == 5
        tree = _tree(proc.pid)
        assert len(tree) >= 4, tree  # three engines and the proxy
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    alive = {pid for pid in tree if (st := _stat(pid)) is not None and st[0] != "Z"}
    assert not alive, alive
    groups = set(tree.values())
    leftovers = [p.name for p in Path("/proc").glob("[0-9]*") if (st := _stat(int(p.name))) and st[2] in groups]
    assert not leftovers
    assert log.read_text().rstrip().endswith("stopped")


async def test_autoscaled_replicas_run_under_the_proxy_and_are_gone_after_sigterm(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engines:\n  - {name: pool, flavor: vllm, model: llama-3.1-8b, min: 1, max: 2, time_scale: 0.02,"
                     " load_gbps: 50}\nautoscaler: {policy: 'cold-start-aware:capacity_rps=2', interval_s: 1}\n")
    log = tmp_path / "up.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*UP, str(fleet)], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(log, r"pool/\* +started by the proxy's autoscaler \(vllm, 1 to 2 replicas\)", proc)
        _wait_for(log, r"1/1 ready, 0 in flight, [\d.]+ req/s, autoscaler wants 1", proc)
        tree = _tree(proc.pid)
        proxy = [pid for pid, _ in tree.items() if _stat(pid)[1] == proc.pid]
        assert len(proxy) == 1 and any(_stat(pid)[1] == proxy[0] for pid in tree), tree  # an engine under it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not {pid for pid in tree if (st := _stat(pid)) is not None and st[0] != "Z"}


def test_demo_replays_the_bundled_trace_and_prints_the_summary(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engines:\n  - {flavor: vllm, model: llama-3.1-8b, replicas: 2, time_scale: 0.02, load_gbps: 50}\n"
                     "proxy: {policy: round-robin}\n"
                     "demo: {speedup: 20, max_requests: 12}\n")
    out = subprocess.run([*UP, str(fleet), "--demo"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"requests ok / sent +12/12\n", out.stdout), out.stdout
    assert re.search(r"TTFT \(ms\) +[\d.]+", out.stdout)
    # engines 50x faster than modelled: the summary is in modelled time, where a llama-3.1-8b
    # decode step on an h100 takes milliseconds (wall TPOT here is a fiftieth of that)
    assert "times are modelled: measured wall times / 0.02 (time scale from target)" in out.stdout
    assert "the engines run 50x faster than modelled" in out.stdout
    tpot_p50 = float(re.search(r"TPOT \(ms\) +[\d.]+ +([\d.]+)", out.stdout).group(1))
    assert 3.0 < tpot_p50 < 30.0, out.stdout
    assert out.stdout.rstrip().endswith("stopped")


def test_a_bad_fleet_file_is_a_usage_error_naming_the_field(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engines:\n  - {flavor: vllm, model: llama-3.1-8b, replicas: 5, max: 2}\n")
    out = subprocess.run([*UP, str(fleet)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "engines[0].replicas=5" in out.stderr and "Traceback" not in out.stderr


def test_a_missing_fleet_file_is_reported_not_raised(tmp_path: Path) -> None:
    out = subprocess.run([*UP, str(tmp_path / "nope.yaml")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "nope.yaml" in out.stderr and "Traceback" not in out.stderr


def test_an_engine_that_cannot_start_fails_the_start_naming_its_log(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engines:\n  - {flavor: vllm, model: no-such-model, time_scale: 0.02}\n")
    out = subprocess.run([*UP, str(fleet), "--ready-timeout-s", "60"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "vllm-0/local-1 exited while starting" in out.stderr
    assert os.path.exists(re.search(r"see (\S+\.log)", out.stderr).group(1))
