"""Processes of the benchmark: start and stop them, wait until they answer, and count the CPU a
process tree used (utime + stime from /proc), including children and threads."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_stat(text: str) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds) from the text of /proc/PID/stat.

    The command name may hold spaces and parentheses, so fields are read after the last ')'.
    """
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def _all_stats() -> dict[int, tuple[int, float]]:
    out: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = parse_stat((entry / "stat").read_text())
            except (OSError, IndexError, ValueError):
                continue  # the process ended while we looked
    return out


def tree_pids(root: int, parents: dict[int, int]) -> set[int]:
    """`root` and every descendant, given each pid's parent."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, []))
    return seen


def live_tree(root: int) -> set[int]:
    """`root` and its live descendants."""
    return tree_pids(root, {pid: s[0] for pid, s in _all_stats().items()})


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a live process tree (threads are inside their process's figures)."""
    stats = _all_stats()
    return sum(stats[p][1] for p in tree_pids(root, {pid: s[0] for pid, s in stats.items()}) if p in stats)


def machine_busy_s() -> tuple[float, float]:
    """(busy CPU seconds, elapsed CPU seconds summed over all CPUs) since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / CLK_TCK, sum(values) / CLK_TCK


@dataclass
class Proc:
    """One started server and its name in the tables."""

    name: str
    popen: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL what is left after 10 s."""
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)
        except ProcessLookupError:
            pass


def spawn(name: str, argv: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> Proc:
    """Start `argv` in its own process group (so its whole tree stops together), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, **(env or {})}, cwd=cwd)
    return Proc(name, popen)


def wait_http(url: str, timeout_s: float = 60.0, proc: Proc | None = None,
              headers: dict[str, str] | None = None) -> float:
    """Poll `url` until it answers 200; return the seconds it took. Fails early if `proc` died."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")
