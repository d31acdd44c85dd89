"""The local actuator: engine replicas as child processes on free 127.0.0.1 ports.

Each replica runs in its own process group (a new session), so a stop reaches every process an
engine command spawns, and nothing outlives `shutdown()`: SIGTERM to the group first (the
engines drain and exit), SIGKILL once the grace period is over.

Nor does a replica outlive the process that started it when that process dies without a stop
(SIGKILL, a crash): on Linux each replica asks the kernel for SIGKILL when its parent dies
(PR_SET_PDEATHSIG). The kernel ties that to the parent *thread*, so replicas must be started
from a thread that lives as long as the process, as the event loop's main thread does. Other
platforms (macOS) have no such call; there a watchdog process, started with the first replica,
holds a pipe from this process and SIGKILLs the groups of the replicas not stopped yet when the
pipe closes, which it does however this process ends.

    actuator = LocalActuator(["fake-vllm", "serve", "llama-3.1-8b", "--time-scale", "0.05"])
    handle = await actuator.start_replica()   # ReplicaHandle(replica_id, url, pid)
    await actuator.stop_replica(handle.replica_id, grace_s=10)
    await actuator.shutdown()
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from proxy.autoscale.actuator import Actuator, ActuatorError, ReplicaHandle


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out for `host`; the replica binds it moments later."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def guess_flavor(engine_cmd: Sequence[str]) -> str:
    """vllm, llamacpp or openai, from the program an engine command runs."""
    words = " ".join(Path(w).name for w in engine_cmd[:3])
    if "llama-server" in words or "llamacpp" in words:
        return "llamacpp"
    return "vllm" if "vllm" in words else "openai"


def resolve_program(program: str) -> str:
    """The program on PATH, else beside this interpreter (a virtual environment's console
    scripts, when the proxy runs from one that is not on PATH)."""
    found = shutil.which(program)
    if found is None and os.sep not in program:
        found = shutil.which(program, path=str(Path(sys.executable).parent))
    return found or program


PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(None, use_errno=True).prctl


def _die_with(parent: int) -> None:
    """In the forked child, before exec: SIGKILL when `parent` dies, or now if it already did."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died between fork and prctl: nobody is left to stop us
        os._exit(1)


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that ties a child's life to this process (Linux); None elsewhere."""
    return functools.partial(_die_with, os.getpid()) if _prctl() is not None else None


WATCHDOG = """
import os, signal, sys
groups = set()
for line in sys.stdin:  # +PGID when a replica starts, -PGID when it is stopped
    (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
for group in groups:  # end of input: the process that started them is gone
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class _Watchdog:
    """The fallback where children cannot ask the kernel to die with their parent: one helper
    process per process, told each replica's group, killing them when its input closes."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def tell(self, sign: str, group: int) -> None:
        if self._process is None:  # its own session: a Ctrl-C meant for us does not end it first
            self._process = subprocess.Popen([sys.executable, "-c", WATCHDOG], stdin=subprocess.PIPE, text=True,
                                             start_new_session=True)
        stdin = self._process.stdin
        assert stdin is not None  # started with stdin=PIPE
        with contextlib.suppress(OSError):
            stdin.write(f"{sign}{group}\n")
            stdin.flush()


_watchdog = _Watchdog()


@dataclass
class _Child:
    handle: ReplicaHandle
    process: asyncio.subprocess.Process


class LocalActuator(Actuator):
    """Starts `engine_cmd --host HOST --port N` once per replica."""

    def __init__(self, engine_cmd: Sequence[str] | str, flavor: str | None = None, host: str = "127.0.0.1",
                 log_dir: Path | None = None) -> None:
        cmd = shlex.split(engine_cmd) if isinstance(engine_cmd, str) else list(engine_cmd)
        if not cmd:
            raise ActuatorError("engine_cmd: empty command")
        self.engine_cmd = [resolve_program(cmd[0]), *cmd[1:]]
        self.flavor = flavor or guess_flavor(cmd)
        self.host = host
        self.log_dir = log_dir
        """Each replica's stdout and stderr go to LOG_DIR/<replica id>.log; discarded when None."""
        self._children: dict[str, _Child] = {}
        self._launched = 0

    @property
    def handles(self) -> list[ReplicaHandle]:
        """Replicas started and not stopped yet."""
        return [c.handle for c in self._children.values()]

    async def start_replica(self) -> ReplicaHandle:
        self._launched += 1
        replica_id = f"local-{self._launched}"
        port = free_port(self.host)
        argv = [*self.engine_cmd, "--host", self.host, "--port", str(port)]
        log_fd = self._log(replica_id)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log_fd,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent())
        except OSError as exc:
            raise ActuatorError(f"cannot start {shlex.join(argv)}: {exc}") from exc
        finally:
            if log_fd >= 0:  # the child holds its own copy
                os.close(log_fd)
        if _prctl() is None:
            _watchdog.tell("+", process.pid)
        host = f"[{self.host}]" if ":" in self.host else self.host
        handle = ReplicaHandle(replica_id, f"http://{host}:{port}", process.pid)
        self._children[replica_id] = _Child(handle, process)
        return handle

    def _log(self, replica_id: str) -> int:
        if self.log_dir is None:
            return asyncio.subprocess.DEVNULL
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return os.open(self.log_dir / f"{replica_id}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def stop_replica(self, replica_id: str, grace_s: float = 10.0) -> None:
        child = self._children.pop(replica_id, None)
        if child is None:
            return
        await _stop_group(child.process, grace_s)

    async def shutdown(self, grace_s: float = 10.0) -> None:
        children, self._children = list(self._children.values()), {}
        await asyncio.gather(*(_stop_group(c.process, grace_s) for c in children))

    async def exited(self) -> list[str]:
        return [rid for rid, c in self._children.items() if c.process.returncode is not None]

    def returncode(self, replica_id: str) -> int | None:
        """Exit status of a replica not stopped yet (negative: the signal that ended it); None
        while it runs."""
        child = self._children.get(replica_id)
        return None if child is None else child.process.returncode


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # The group can outlive its leader (an engine's helpers), so signal it even after the
    # leader exited; it is gone for good once the kernel says so.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _stop_group(process: asyncio.subprocess.Process, grace_s: float) -> None:
    _signal_group(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=grace_s)
    except TimeoutError:
        pass
    _signal_group(process.pid, signal.SIGKILL)
    await process.wait()
    if _prctl() is None:  # the group is gone: its id may be handed out again
        _watchdog.tell("-", process.pid)
