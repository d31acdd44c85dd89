"""`flotilla up` as a real subprocess: ready, serving through the proxy, nothing left after SIGTERM,
SIGHUP or SIGKILL, and failing at once, in one line, on a taken port, a crashed engine or a bad file."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
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


MARK = "FLOTILLA_TEST_RUN"
"""An environment variable every process a `flotilla up` starts inherits: how a test finds them all."""


def _env(mark: str) -> dict[str, str]:
    return {**os.environ, MARK: mark}


def _marked(mark: str) -> list[int]:
    """Live processes (zombies do not count) whose environment carries MARK=mark."""
    needle, found = f"{MARK}={mark}".encode(), []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env and (st := _stat(int(entry.name))) is not None and st[0] != "Z":
            found.append(int(entry.name))
    return found


def _gone(mark: str, timeout_s: float = 30.0) -> list[int]:
    """Waits until no process carries the mark; those still alive at the deadline (then killed)."""
    deadline = time.monotonic() + timeout_s
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:  # leave the machine clean for the next test either way
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


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
        # stdout is a file, not a terminal: after the table, one line per refresh, not a table each time
        _wait_for(log, r"(\n\d\d:\d\d:\d\d 3/3 ready, \d+ in flight, .*req/s, autoscaler wants 2){3}", proc)
        text = log.read_text()
        assert text.count("\nbackend ") < text.count(" 3/3 ready, ") / 2, text
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


async def test_autoscaled_replicas_run_under_the_proxy_and_are_gone_after_sighup(tmp_path: Path) -> None:
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
        proc.send_signal(signal.SIGHUP)  # what a closed terminal sends
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
    # no upper bound: on a busy machine event-loop lag, multiplied by 50, lengthens modelled TPOT
    assert tpot_p50 > 3.0, out.stdout
    assert out.stdout.rstrip().endswith("stopped")


@pytest.mark.parametrize(("engine", "extra", "field"), [
    ("model: llama-3.1-8b, replicas: 5, max: 2", "", "engines[0].replicas=5"),
    ("model: llama-9b", "", "engines[0].model='llama-9b': is not in the catalogue"),
    ("model: llama-3.1-8b, gpu: tpu-v9", "", "engines[0].gpu='tpu-v9': is not in the catalogue"),
    ("model: llama-3.1-8b", "proxy: {policy: fastest}\n", "proxy.policy='fastest': unknown routing policy"),
    ("model: llama-3.1-8b, min: 1, max: 2", "autoscaler: {policy: psychic}\n",
     "autoscaler.policy='psychic': unknown scaling policy"),
])
def test_a_bad_fleet_file_is_one_line_naming_the_field_before_anything_starts(
        tmp_path: Path, engine: str, extra: str, field: str) -> None:
    fleet, mark = tmp_path / "fleet.yaml", uuid.uuid4().hex
    fleet.write_text(f"engines:\n  - {{flavor: vllm, {engine}}}\n{extra}")
    out = subprocess.run([*UP, str(fleet), "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True,
                         timeout=60, env=_env(mark))
    assert out.returncode == 2
    assert out.stderr.startswith("flotilla up: error: ") and out.stderr.count("\n") == 1, out.stderr
    assert field in out.stderr, out.stderr
    assert not (tmp_path / "logs").exists() and out.stdout == ""  # nothing started, nothing logged
    assert _gone(mark) == []


def test_a_missing_fleet_file_is_reported_not_raised(tmp_path: Path) -> None:
    out = subprocess.run([*UP, str(tmp_path / "nope.yaml")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "nope.yaml" in out.stderr and "Traceback" not in out.stderr


def test_an_engine_that_exits_at_start_is_one_line_naming_why_and_its_log(tmp_path: Path) -> None:
    fleet, mark = tmp_path / "fleet.yaml", uuid.uuid4().hex
    # a 70B model in 16-bit weights does not fit one 24 GB RTX 4090: the engine exits as vLLM would
    fleet.write_text("engines:\n  - {flavor: vllm, model: llama-3.1-70b, gpu: rtx4090, time_scale: 0.02}\n")
    out = subprocess.run([*UP, str(fleet), "--ready-timeout-s", "60"], capture_output=True, text=True, timeout=120,
                         env=_env(mark))
    assert out.returncode == 1
    line = re.fullmatch(r"flotilla up: error: vllm-0/local-1 exited while starting: (.*) \(log (\S+\.log)\)\n",
                        out.stderr)
    assert line is not None, out.stderr
    assert "OutOfMemoryError" in line.group(1) and os.path.exists(line.group(2))
    assert _gone(mark) == []


def test_an_autoscaled_engine_that_exits_at_start_fails_the_start_too(tmp_path: Path) -> None:
    fleet, mark = tmp_path / "fleet.yaml", uuid.uuid4().hex
    fleet.write_text("engines:\n  - {name: pool, flavor: vllm, model: llama-3.1-70b, gpu: rtx4090, min: 1, max: 2,"
                     " time_scale: 0.02}\nautoscaler: {policy: 'cold-start-aware:capacity_rps=2', interval_s: 1}\n")
    out = subprocess.run([*UP, str(fleet), "--ready-timeout-s", "90"], capture_output=True, text=True, timeout=150,
                         env=_env(mark))
    assert out.returncode == 1
    assert re.fullmatch(r"flotilla up: error: pool/local-\d+, started by the proxy's autoscaler, exited while "
                        r"starting: .*OutOfMemoryError.* \(log \S+/pool/local-\d+\.log\)\n", out.stderr), out.stderr
    assert _gone(mark) == []


def test_a_taken_port_fails_at_once_naming_it_and_starts_nothing(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([*UP, "--port", str(port), "--log-dir", str(tmp_path / "logs")], capture_output=True,
                             text=True, timeout=60, env=_env(mark))
    assert out.returncode == 2
    assert out.stderr == (f"flotilla up: error: port {port} on 127.0.0.1 is in use; choose another with --port "
                          "(--port 0 picks a free one)\n")
    assert not (tmp_path / "logs").exists() and out.stdout == ""
    assert _gone(mark) == []


def test_sigkill_of_flotilla_up_leaves_no_process_it_started(tmp_path: Path) -> None:
    fleet, mark = tmp_path / "fleet.yaml", uuid.uuid4().hex
    fleet.write_text("engines:\n  - {flavor: llamacpp, model: llama-3.2-1b, gpu: rtx4090, time_scale: 0.02,"
                     " load_gbps: 50}\n  - {name: pool, flavor: vllm, model: llama-3.2-1b, min: 1, max: 2,"
                     " time_scale: 0.02, load_gbps: 50}\nautoscaler: {policy: 'cold-start-aware:capacity_rps=2'}\n")
    log = tmp_path / "up.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*UP, str(fleet)], stdout=out, stderr=subprocess.STDOUT, env=_env(mark))
    try:
        _wait_for(log, r"fleet ready in", proc)
        tree = _tree(proc.pid)
        # one engine and the proxy under flotilla up, the autoscaled engine under the proxy
        assert len(tree) >= 3 and set(tree) <= set(_marked(mark)), (tree, _marked(mark))
        assert any(_stat(pid)[1] != proc.pid for pid in tree), tree
        proc.kill()  # no handler runs: only the kernel can end the children now
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _gone(mark) == []
