"""A local fleet's lifecycle for `flotilla up`: start, wait until ready, poll status, stop.

Every process starts through the autoscaler's local actuator (proxy/autoscale/local.py), each in
its own process group. Stopping is SIGTERM to each group, a bounded wait, then SIGKILL for the
groups and for any descendant recorded before the stop that is still alive, so nothing is left
behind even when a child's own children escaped its group. On Linux this process also becomes a
child subreaper, so an engine orphaned by a dying proxy is reparented here and reaped, and every
child dies with its parent even when the parent gets no chance to stop it (PR_SET_PDEATHSIG, set
by the local actuator).

The fleet counts as up only when its own proxy answers: the proxy is started with a per-run
`--instance-id` and every answer must carry it back, so another server on the port is never
mistaken for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import re
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from flotilla.proxy_cmd import INSTANCE_HEADER
from proxy.autoscale import local
from proxy.autoscale.actuator import ActuatorError, ReplicaHandle
from proxy.autoscale.local import LocalActuator
from proxy.config import KVEventsSource
from proxy.fleetfile import EngineGroup, UpFleet, without_address
from proxy.status import FleetStatus, fleet_status

PR_SET_CHILD_SUBREAPER = 36
HTTP_TIMEOUT_S = 2.0
LAST_LINE_CHARS = 400
AUTOSCALED_EXIT = re.compile(r"autoscaler: replica (\S+) exited on its own")
"""What the proxy's autoscaler logs (proxy/autoscale/loop.py) when a replica it started exits."""


class FleetError(RuntimeError):
    """The fleet could not start: a process exited or readiness timed out."""


@dataclass
class Member:
    """One started process of the fleet."""

    name: str
    """Group name and replica, e.g. vllm/local-1, or proxy."""
    handle: ReplicaHandle
    """Its URL and pid (the pid is also its process group id)."""
    actuator: LocalActuator
    """The actuator that started it, which also stops it."""
    log_path: Path
    """Its stdout and stderr."""

    @property
    def url(self) -> str:
        """Where it answers: a local process always has a URL once started."""
        assert self.handle.url is not None
        return self.handle.url

    def exit_reason(self) -> str:
        """Why it exited, as its log's last line says (or its exit status)."""
        status = self.actuator.returncode(self.handle.replica_id)
        return last_line(self.log_path) or f"exit status {status}"


def last_line(path: Path) -> str:
    """The last non-blank line of a log, shortened; empty when there is none."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:LAST_LINE_CHARS] if lines else ""


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """FleetError naming the port when nothing could listen on it now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy binds it
        try:
            sock.bind((host, port))
        except OSError as exc:
            reason = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            raise FleetError(f"port {port} on {host} {reason}; choose another with --port "
                             "(--port 0 picks a free one)") from None


def become_subreaper() -> bool:
    """Orphaned descendants are reparented to this process instead of init (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (empty where /proc is missing)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.append(int(entry.name))
    return found


def descendants_of(pid: int) -> list[int]:
    """Every process below `pid`, children first."""
    out, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        out += kids
        todo += kids
    return out


def proxy_fleet_file(fleet: UpFleet, backends: list[tuple[str, str, str]],
                     log_dir: Path | None = None) -> dict[str, object]:
    """What `flotilla proxy --config` reads: the policy, the started engines as backends
    (flavor, url, group name) weighed by their group's capacity and, when one group is
    autoscaled, the proxy's `autoscaler:` section for it (its replicas log under `log_dir`, if
    given). `flotilla compose` and `flotilla k8s` build their proxy's fleet file from it too."""
    weights = {g.name: g.capacity_weight() for g in fleet.engines}
    events = {g.name: g.kv_events() for g in fleet.engines}
    roles = {g.name: {"role": g.role} if g.role else {} for g in fleet.engines}
    data: dict[str, object] = {"proxy": {"policy": fleet.policy, "backends": [
        {"url": url, "flavor": f, "weight": weights[name], **_kv_events_entry(events[name]), **roles[name]}
        for f, url, name in backends]}}
    group = fleet.scaled_group()
    if fleet.autoscaler is not None and group is not None:
        data["autoscaler"] = fleet.autoscaler.for_proxy(group, log_dir / group.name if log_dir else None)
    return data


def _kv_events_entry(source: KVEventsSource | None) -> dict[str, object]:
    """A fleet-file backend's `kv_events` key for an engine that publishes KV-cache events."""
    if source is None:
        return {}
    return {"kv_events": {"endpoint": source.endpoint, "replay_endpoint": source.replay_endpoint,
                          "topic": source.topic}}


def proxy_command(config: Path, instance: str) -> list[str]:
    """`flotilla proxy` over the generated fleet file, answering with `instance` in its
    x-flotilla-instance header; the actuator appends --host and --port."""
    return [sys.executable, "-m", "flotilla", "proxy", "--config", str(config), "--instance-id", instance]


@dataclass
class Fleet:
    """A running local fleet: its processes and where they log."""

    spec: UpFleet
    log_dir: Path
    members: list[Member] = field(default_factory=list)
    proxy_url: str = ""
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    """This run's token: its proxy answers with it, nothing else does."""

    @property
    def engines(self) -> list[Member]:
        return [m for m in self.members if m.name != "proxy"]

    async def start(self, port: int) -> None:
        """Start the fixed engine groups, then the proxy on 127.0.0.1:`port` (0: a free port)."""
        try:
            await self._start(port)
        except (ActuatorError, OSError) as exc:  # a missing program, an unwritable log folder
            raise FleetError(str(exc)) from None

    async def _start(self, port: int) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        scaled = self.spec.scaled_group()
        for group in self.spec.engines:
            if group is not scaled:
                await self._start_group(group, group.replicas)
        backends = [(m.actuator.flavor, m.url, m.name.split("/")[0]) for m in self.engines]
        config = self.log_dir / "proxy-fleet.yaml"
        config.write_text(yaml.safe_dump(proxy_fleet_file(self.spec, backends, self.log_dir), sort_keys=False))
        logs = self.log_dir / "proxy"
        actuator = LocalActuator(proxy_command(config, self.instance), flavor="openai", log_dir=logs)
        handle = await _start_on_port(actuator, port or local.free_port())
        member = Member("proxy", handle, actuator, logs / f"{handle.replica_id}.log")
        self.members.append(member)
        self.proxy_url = member.url

    async def _start_group(self, group: EngineGroup, replicas: int) -> None:
        logs = self.log_dir / group.name
        actuator = LocalActuator(without_address(group.command(port=0)), flavor=group.flavor, log_dir=logs)
        for _ in range(replicas):
            handle = await actuator.start_replica()
            self.members.append(Member(f"{group.name}/{handle.replica_id}", handle, actuator,
                                       logs / f"{handle.replica_id}.log"))

    @property
    def proxy(self) -> Member | None:
        return next((m for m in self.members if m.name == "proxy"), None)

    def expected_ready(self) -> int:
        """Backends that must be ready before the fleet counts as up."""
        scaled = self.spec.scaled_group()
        return sum(g.min_replicas if g is scaled else g.replicas for g in self.spec.engines)

    async def crashed(self) -> list[Member]:
        """Members whose process exited on its own."""
        gone: list[Member] = []
        for actuator in {id(m.actuator): m.actuator for m in self.members}.values():
            ids = set(await actuator.exited())  # replica ids are unique per actuator only
            gone += [m for m in self.members if m.actuator is actuator and m.handle.replica_id in ids]
        return gone

    async def stop(self, grace_s: float = 10.0) -> None:
        """Proxy first (it stops routing and its own autoscaled replicas), then the engines."""
        recorded = descendants_of(os.getpid())
        actuators = list({id(m.actuator): m.actuator for m in self.members}.values())
        proxy = [a for a in actuators if any(m.actuator is a and m.name == "proxy" for m in self.members)]
        for group in (proxy, [a for a in actuators if a not in proxy]):
            await asyncio.gather(*(a.shutdown(grace_s) for a in group))
        kill_stragglers(recorded, {m.handle.pid for m in self.members})


async def _start_on_port(actuator: LocalActuator, port: int) -> ReplicaHandle:
    # The actuator hands out a free port itself; the proxy must listen where the user asked.
    # start_replica reads the port before its first await, so the swap is seen by this call only.
    chosen, local.free_port = local.free_port, lambda host="127.0.0.1": port
    try:
        return await actuator.start_replica()
    finally:
        local.free_port = chosen


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def kill_stragglers(recorded: list[int], groups: set[int | None]) -> None:
    """SIGKILL every descendant still alive, and every recorded one still in one of our process
    groups (orphans that went to init), then reap those that are ours."""
    # A recorded pid outside our groups may already be someone else's: never touch it.
    alive = set(descendants_of(os.getpid())) | {p for p in recorded if _group_of(p) in groups}
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for pid in alive:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


async def _get_text(session: aiohttp.ClientSession, url: str, instance: str | None = None) -> str | None:
    """The body of a 200 answer (carrying `instance` in its header when given), else None."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as resp:
            if resp.status != 200 or instance is not None and resp.headers.get(INSTANCE_HEADER) != instance:
                return None
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None


async def answering_instance(session: aiohttp.ClientSession, proxy_url: str) -> str | None:
    """The instance header of whatever answers at the proxy's address ("" for a server that
    sends none); None when nothing answers."""
    try:
        async with session.get(proxy_url + "/health", timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as resp:
            return resp.headers.get(INSTANCE_HEADER, "")
    except (aiohttp.ClientError, TimeoutError):
        return None


async def poll_status(session: aiohttp.ClientSession, proxy_url: str, instance: str | None = None) -> FleetStatus | None:
    """One snapshot: the proxy's /metrics and each backend's own /metrics; None if the proxy is
    down or, given `instance`, if what answers is not that proxy."""
    text = await _get_text(session, proxy_url + "/metrics", instance)
    if text is None:
        return None
    now = time.monotonic()
    urls = [b.url for b in fleet_status(now, text, {}).backends]
    engine_texts = await asyncio.gather(*(_get_text(session, u + "/metrics") for u in urls))
    return fleet_status(now, text, dict(zip(urls, engine_texts, strict=True)))


def _exited(member: Member, when: str) -> str:
    return f"{member.name} exited {when}: {member.exit_reason()} (log {member.log_path})"


def _autoscaled_exit(fleet: Fleet) -> str | None:
    """A line about a replica the proxy's autoscaler started that exited, from the proxy's log."""
    proxy, group = fleet.proxy, fleet.spec.scaled_group()
    if proxy is None or group is None:
        return None
    found = AUTOSCALED_EXIT.search(proxy.log_path.read_text(errors="replace"))
    if found is None:
        return None
    log = fleet.log_dir / group.name / f"{found.group(1)}.log"
    return (f"{group.name}/{found.group(1)}, started by the proxy's autoscaler, exited while starting: "
            f"{last_line(log) or 'no output'} (log {log})")


async def _check_alive(fleet: Fleet, session: aiohttp.ClientSession, proxy_answered: bool) -> None:
    """FleetError when a started process exited or another server answers at the proxy's address."""
    crashed = await fleet.crashed()
    if crashed:
        raise FleetError(_exited(crashed[0], "while starting"))
    if (line := _autoscaled_exit(fleet)) is not None:
        raise FleetError(line)
    if proxy_answered:
        return
    answer = await answering_instance(session, fleet.proxy_url)
    if answer is not None and answer != fleet.instance:
        port = fleet.proxy_url.rsplit(":", 1)[1]
        raise FleetError(f"another server answers on port {port}, not the proxy flotilla up started; "
                         "choose another with --port (--port 0 picks a free one)")


async def wait_ready(fleet: Fleet, session: aiohttp.ClientSession, timeout_s: float,
                     progress: Callable[[str], None]) -> FleetStatus:
    """Until this run's proxy reports the expected backends ready; FleetError when a process it
    started exits, another server holds its port, or the timeout passes."""
    want, start, said = fleet.expected_ready(), time.monotonic(), ""
    while True:
        status = await poll_status(session, fleet.proxy_url, fleet.instance)
        await _check_alive(fleet, session, proxy_answered=status is not None)
        line = "proxy starting" if status is None else f"{status.ready}/{want} engines ready"
        if line != said:
            progress(f"  {line} ({time.monotonic() - start:.1f} s)")
            said = line
        if status is not None and status.ready >= want:
            return status
        if time.monotonic() - start > timeout_s:
            raise FleetError(f"the fleet was not ready within {timeout_s:g} s ({line}); logs in {fleet.log_dir}")
        await asyncio.sleep(0.2)


async def exits_since(fleet: Fleet, reported: set[str]) -> list[str]:
    """Lines about members that exited since the last call (names kept in `reported`);
    FleetError when the proxy did, since nothing is served without it."""
    lines = []
    for member in await fleet.crashed():
        if member.name == "proxy":
            raise FleetError(_exited(member, "while serving"))
        if member.name not in reported:
            reported.add(member.name)
            lines.append(_exited(member, "while serving"))
    return lines
