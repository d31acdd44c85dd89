"""Process bookkeeping of `flotilla up`: descendants from /proc, orphans adopted and killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from proxy.supervisor import descendants_of

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
