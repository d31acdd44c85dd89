"""A local fleet's lifecycle for `flotilla up`: start, wait until ready, poll status, stop.

Every process starts through the autoscaler's local actuator (proxy/autoscale/local.py), each in
its own process group. Stopping is SIGTERM to each group, a bounded wait, then SIGKILL for the
groups and for any descendant recorded before the stop that is still alive, so nothing is left
behind even when a child's own children escaped its group. On Linux this process also becomes a
child subreaper, so an engine orphaned by a dying proxy is reparented here and reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from proxy.autoscale import local
from proxy.autoscale.actuator import ReplicaHandle
from proxy.autoscale.local import LocalActuator
from proxy.fleetfile import EngineGroup, UpFleet, without_address
from proxy.status import FleetStatus, fleet_status

PR_SET_CHILD_SUBREAPER = 36
HTTP_TIMEOUT_S = 2.0


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


def proxy_fleet_file(fleet: UpFleet, backends: list[tuple[str, str]], log_dir: Path) -> dict[str, object]:
    """What `flotilla proxy --config` reads: the policy, the started engines as backends and,
    when one group is autoscaled, the proxy's `autoscaler:` section for it."""
    data: dict[str, object] = {"proxy": {"policy": fleet.policy,
                                         "backends": [{"url": url, "flavor": f} for f, url in backends]}}
    group = fleet.scaled_group()
    if fleet.autoscaler is not None and group is not None:
        data["autoscaler"] = fleet.autoscaler.for_proxy(group, log_dir / group.name)
    return data


def proxy_command(config: Path) -> list[str]:
    """`flotilla proxy` over the generated fleet file; the actuator appends --host and --port."""
    return [sys.executable, "-m", "flotilla", "proxy", "--config", str(config)]


@dataclass
class Fleet:
    """A running local fleet: its processes and where they log."""

    spec: UpFleet
    log_dir: Path
    members: list[Member] = field(default_factory=list)
    proxy_url: str = ""

    @property
    def engines(self) -> list[Member]:
        return [m for m in self.members if m.name != "proxy"]

    async def start(self, port: int) -> None:
        """Start the fixed engine groups, then the proxy on 127.0.0.1:`port` (0: a free port)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        scaled = self.spec.scaled_group()
        for group in self.spec.engines:
            if group is not scaled:
                await self._start_group(group, group.replicas)
        backends = [(m.actuator.flavor, m.handle.url) for m in self.engines]
        config = self.log_dir / "proxy-fleet.yaml"
        config.write_text(yaml.safe_dump(proxy_fleet_file(self.spec, backends, self.log_dir), sort_keys=False))
        actuator = LocalActuator(proxy_command(config), flavor="openai", log_dir=self.log_dir / "proxy")
        handle = await _start_on_port(actuator, port or local.free_port())
        self.members.append(Member("proxy", handle, actuator, actuator.log_dir / f"{handle.replica_id}.log"))
        self.proxy_url = handle.url

    async def _start_group(self, group: EngineGroup, replicas: int) -> None:
        actuator = LocalActuator(without_address(group.command(port=0)), flavor=group.flavor,
                                 log_dir=self.log_dir / group.name)
        for _ in range(replicas):
            handle = await actuator.start_replica()
            self.members.append(Member(f"{group.name}/{handle.replica_id}", handle, actuator,
                                       actuator.log_dir / f"{handle.replica_id}.log"))

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


async def _get_text(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as resp:
            return await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None


async def poll_status(session: aiohttp.ClientSession, proxy_url: str) -> FleetStatus | None:
    """One snapshot: the proxy's /metrics and each backend's own /metrics; None if the proxy is down."""
    text = await _get_text(session, proxy_url + "/metrics")
    if text is None:
        return None
    now = time.monotonic()
    urls = [b.url for b in fleet_status(now, text, {}).backends]
    engine_texts = await asyncio.gather(*(_get_text(session, u + "/metrics") for u in urls))
    return fleet_status(now, text, dict(zip(urls, engine_texts, strict=True)))


async def wait_ready(fleet: Fleet, session: aiohttp.ClientSession, timeout_s: float,
                     progress: Callable[[str], None]) -> FleetStatus:
    """Until the proxy reports the expected backends ready; FleetError on a crash or the timeout."""
    want, start, said = fleet.expected_ready(), time.monotonic(), ""
    while True:
        crashed = await fleet.crashed()
        if crashed:
            raise FleetError(f"{crashed[0].name} exited while starting; see {crashed[0].log_path}")
        status = await poll_status(session, fleet.proxy_url)
        line = "proxy starting" if status is None else f"{status.ready}/{want} engines ready"
        if line != said:
            progress(f"  {line} ({time.monotonic() - start:.1f} s)")
            said = line
        if status is not None and status.ready >= want:
            return status
        if time.monotonic() - start > timeout_s:
            raise FleetError(f"the fleet was not ready within {timeout_s:g} s ({line}); logs in {fleet.log_dir}")
        await asyncio.sleep(0.2)
