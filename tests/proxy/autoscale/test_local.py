"""The local actuator with real child processes: look-alike engines that serve, and shell
commands that spawn helpers or ignore SIGTERM, none of which may outlive a stop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import pytest

from proxy.autoscale.local import LocalActuator, guess_flavor, resolve_program
from tests.waiting import wait_until

VLLM_CMD = [sys.executable, "-m", "fake_engines.vllm.cli", "serve", "llama-3.1-8b", "--gpu", "h100",
            "--time-scale", "0.05"]
# A replica that starts a helper and ignores SIGTERM, so only the group's SIGKILL ends it.
STUBBORN_CMD = ["sh", "-c", "trap '' TERM; sleep 300 & sleep 300 & wait", "sh"]


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group, read from /proc (zombies do not count)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


async def wait_healthy(url: str, timeout_s: float = 60.0) -> int:
    async with aiohttp.ClientSession() as session:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            try:
                async with session.get(url + "/health") as resp:
                    if resp.status == 200:
                        return 200
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    return 0


async def wait_members_gone(pgid: int, timeout_s: float = 30.0) -> list[int]:
    """[] once the process group is empty; on a busy machine a stopped group can take seconds."""
    for _ in range(int(timeout_s / 0.05)):
        if not group_members(pgid):
            return []
        await asyncio.sleep(0.05)
    return group_members(pgid)


async def test_a_started_replica_serves_on_its_own_port_and_a_stop_ends_it():
    actuator = LocalActuator(VLLM_CMD)
    try:
        a = await actuator.start_replica()
        b = await actuator.start_replica()
        assert a.replica_id != b.replica_id and a.url != b.url
        assert a.url.startswith("http://127.0.0.1:")
        assert actuator.flavor == "vllm"
        assert await wait_healthy(a.url) == 200
        await actuator.stop_replica(a.replica_id, grace_s=10)
        assert await wait_members_gone(a.pid) == []
        assert [h.replica_id for h in actuator.handles] == [b.replica_id]
    finally:
        await actuator.shutdown()
    assert await wait_members_gone(b.pid) == []


async def test_shutdown_kills_helpers_and_replicas_that_ignore_sigterm():
    actuator = LocalActuator(STUBBORN_CMD)
    handles = [await actuator.start_replica() for _ in range(2)]
    deadline = asyncio.get_running_loop().time() + 30
    while not all(len(group_members(h.pid)) >= 3 for h in handles):  # the shells spawn their helpers
        assert asyncio.get_running_loop().time() < deadline, [group_members(h.pid) for h in handles]
        await asyncio.sleep(0.05)
    await actuator.shutdown(grace_s=0.5)
    for h in handles:
        assert await wait_members_gone(h.pid) == []
    assert actuator.handles == []


async def test_a_replica_that_exits_on_its_own_is_reported():
    actuator = LocalActuator(["sh", "-c", "exit 3", "sh"])
    handle = await actuator.start_replica()
    assert await wait_until(actuator.exited, what="the replica reported exited") == [handle.replica_id]
    await actuator.shutdown()


async def test_replica_output_goes_to_its_log_file(tmp_path):
    actuator = LocalActuator(["sh", "-c", 'echo "listening on $4"', "sh"], log_dir=tmp_path)
    handle = await actuator.start_replica()
    # the command ends on its own once it wrote its line
    await wait_until(actuator.exited, what="the replica's command ended")
    await actuator.shutdown()
    port = handle.url.rsplit(":", 1)[1]
    assert (tmp_path / f"{handle.replica_id}.log").read_text() == f"listening on {port}\n"


def test_flavor_follows_the_engine_program():
    assert guess_flavor(["fake-llama-server", "-m", "x.gguf"]) == "llamacpp"
    assert guess_flavor(["/opt/bin/llama-server", "-m", "x.gguf"]) == "llamacpp"
    assert guess_flavor(["vllm", "serve", "m"]) == "vllm"
    assert guess_flavor(["python", "-m", "fake_engines.vllm.cli"]) == "vllm"
    assert guess_flavor(["my-server"]) == "openai"


def test_console_scripts_resolve_beside_the_interpreter_without_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert resolve_program("fake-vllm") == os.path.join(os.path.dirname(sys.executable), "fake-vllm")


# A parent that starts a replica (sh exec-ing sleep, so the pid stays the same), says its pid,
# then waits to be killed. argv[1] picks asyncio's own loop, uvloop (the proxy runs on it), or
# the watchdog that stands in for PR_SET_PDEATHSIG where there is none (macOS).
PARENT = textwrap.dedent("""
    import asyncio, sys
    from proxy.autoscale import local
    from proxy.autoscale.local import LocalActuator

    if sys.argv[1] == "watchdog":
        local._prctl = lambda: None

    async def main():
        handle = await LocalActuator(["sh", "-c", "exec sleep 300", "sh"]).start_replica()
        print(handle.pid, flush=True)
        await asyncio.sleep(300)

    if sys.argv[1] == "uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())
""")


def alive(pid: int) -> bool:
    """Running, neither gone nor a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "watchdog"])
def test_a_replica_dies_with_the_process_that_started_it_even_on_sigkill(loop: str) -> None:
    if loop == "uvloop":
        pytest.importorskip(loop)
    if loop != "watchdog" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, loop], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[3])
    replica = 0
    try:
        replica = int(parent.stdout.readline())
        assert alive(replica)
        parent.kill()  # no handler runs, no stop is sent: only the kernel can end the replica
        parent.wait(30)
        deadline = time.monotonic() + 30
        while alive(replica) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(replica)
    finally:
        parent.kill()
        parent.wait()
        if replica and alive(replica):
            os.kill(replica, signal.SIGKILL)
