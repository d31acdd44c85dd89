"""`flotilla proxy --workers N`: N processes serving one listening address, sharing routing state.

One Python event loop tops out at one core (docs/benchmarks.md); N worker processes use N.
What the workers must agree on is shared, without locks on the request path:

- **The listening address.** Where the platform has SO_REUSEPORT (Linux, the BSDs), each worker
  binds its own socket to the address and the kernel spreads new connections over them by a
  hash of the connection, so no worker takes more than its share while another idles (one
  socket accepted by every worker wakes them all and lets the fastest take most connections).
  The parent binds the address first (without listening, so it takes no connection): the port
  is resolved once (`--port 0`) and stays held while a worker restarts. Elsewhere the parent
  binds and listens once and the workers inherit that socket.
- **In-flight work per backend** (`SharedLoad`, proxy/shared_load.py): an anonymous shared
  memory map with one row per worker; each worker writes only its own row (plain stores, no
  lock, no read-modify-write across processes) and a routing decision adds up the other rows.
  The parent zeroes a dead worker's row. Backends get their column by a hash of their URL,
  claimed under a file lock when a backend is first seen (not on the request path).
- **Engine scrapes** (`Coordinator`): one worker, the leader, scrapes the engines and publishes
  each round as a snapshot file; the others read it. The leader is whoever holds an exclusive
  `flock` on a lock file; the kernel drops the lock when its holder dies, and the next worker
  to try takes over within one scrape interval.
- **The autoscaler** (`--autoscale`): only the leader runs it, and the engines it starts are
  its children (they die with it: proxy/autoscale/local.py). Its snapshot names the replicas
  it serves from, so every worker routes to a new replica and stops routing to a drained one.
  A worker holding a request at zero replicas asks the leader for one through a wake file;
  each worker's arrivals and held requests sit in its row of the shared map for the leader's
  policy to add up. A
  new leader drains the replicas of the one that died (they died with it) and scales afresh:
  no engine is orphaned, none is started twice.
- **Admin changes** (`AdminJournal`): the worker that serves `POST` or `DELETE /admin/backends`
  applies the change and appends it to a journal file under a file lock, after applying every
  earlier line; the others apply new lines every scrape round and before answering the admin
  API, so all pools agree within one round. A restarted worker replays the journal.
- **KV-cache events**: every worker subscribes to every publisher itself (ZMQ PUB broadcasts).
- **/metrics**: prometheus_client's multiprocess mode over a directory the parent owns and
  removes; every worker's counters and histograms add up, and the per-backend gauges are
  written from the shared state by whichever worker answers the scrape.

Routing stays deterministic across workers and across separate proxy replicas: policies hash
strings with `stable_hash` (never the per-process salted `hash()` of a str).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flotilla.cli_errors import positive_int
from proxy.shared_load import SharedLoad, file_lock

if TYPE_CHECKING:
    from aiohttp import web

    from proxy.config import BackendSpec
    from proxy.pool import Backend, BackendPool
    from proxy.scraper import Scraper

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 1
"""One process unless asked: a proxy beside engines on a small machine should not take every
core by default, and on 2 cores one worker serves more than two (docs/benchmarks.md)."""
WORKER_HEADER = "x-flotilla-worker"
"""The pid of the worker that answered, on every response of a multi-worker proxy."""
RESTART_DELAY_S = 1.0
AUTOSCALED = "autoscaler"
"""The pool source of the replicas an autoscaler started (proxy/autoscale/loop.py)."""


def worker_count(text: str) -> int:
    """--workers: a positive count, or `auto` for one per core this process may run on."""
    if text == "auto":
        return available_cores()
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or auto, not {text!r}") from None


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on this platform
        return os.cpu_count() or 1


@dataclass
class WorkerContext:
    """What one worker process gets from the parent."""

    index: int
    workers: int
    run_dir: Path
    load: SharedLoad
    host: str
    port: int
    sock: socket.socket | None
    """The inherited listening socket; None where each worker binds its own (SO_REUSEPORT)."""
    ready_fd: int

    @property
    def metrics_dir(self) -> Path:
        return self.run_dir / "metrics"

    def listening_socket(self) -> socket.socket:
        if self.sock is not None:
            return self.sock
        return bind_socket(self.host, self.port, reuse_port=True, listen=True)

    def ready(self) -> None:
        with contextlib.suppress(OSError):  # a restarted worker: nobody waits for it
            os.write(self.ready_fd, b"1")
            os.close(self.ready_fd)


def bind_socket(host: str, port: int, reuse_port: bool, listen: bool) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def has_reuse_port() -> bool:
    return hasattr(socket, "SO_REUSEPORT") and sys.platform != "win32"


class Coordinator:
    """Leader election and the scrape snapshot (see the module)."""

    def __init__(self, run_dir: Path, pool: BackendPool, interval_s: float,
                 on_lead: Callable[[], None] = lambda: None) -> None:
        self.lock_path = run_dir / "leader.lock"
        self.snapshot_path = run_dir / "scrape.pickle"
        self.wake_path = run_dir / "wake"
        self.on_wake: Callable[[], None] = lambda: None
        """In the leader: a worker holds a request at zero replicas (see `wake`)."""
        self.every_round: list[Callable[[], None]] = []
        self.pool = pool
        self.interval_s = interval_s
        self.on_lead = on_lead
        self.leading = False
        self._lock_file: Any = None
        self._seen_ns = 0
        self._epoch_starts: dict[str, deque[tuple[int, float]]] = {}

    def try_lead(self) -> bool:
        if self._lock_file is None:
            self._lock_file = open(self.lock_path, "a+b")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.leading = True
        log.info("worker %d leads: it scrapes the engines", os.getpid())
        self.on_lead()
        return True

    async def run(self, scraper: Scraper) -> None:
        while True:
            for each in self.every_round:
                each()
            if self.leading or self.try_lead():
                self._take_wake()
                await scraper.scrape_all()
                self.publish()
            else:
                self.follow()
            await asyncio.sleep(self.interval_s)

    def wake(self) -> None:
        """A request waits for a replica here: ask the leader's autoscaler for one."""
        if self.leading:
            self.on_wake()
        else:
            with contextlib.suppress(OSError):
                self.wake_path.touch()

    def _take_wake(self) -> None:
        try:
            self.wake_path.unlink()
        except FileNotFoundError:
            return
        self.on_wake()

    def publish(self) -> None:
        from proxy.pool import BackendState

        scaled = [b.spec for b in self.pool if b.source == AUTOSCALED and b.state is not BackendState.DRAINING]
        samples = {b.url: (b.sample, b.sample_time_s) for b in self.pool if b.sample is not None}
        snapshot = {"samples": samples, "scaled": scaled}
        tmp = self.snapshot_path.with_name(f"scrape.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(snapshot))
        os.replace(tmp, self.snapshot_path)  # readers see the old snapshot or the new, never half

    def follow(self, now_s: float | None = None) -> None:
        """Take the leader's newest scrapes. Each call starts a new scrape epoch here, so a
        scrape sent at time T clears only the requests this worker picked before T."""
        now_s = time.monotonic() if now_s is None else now_s
        for b in self.pool:
            starts = self._epoch_starts.setdefault(b.url, deque(maxlen=512))
            starts.append((self.pool.begin_scrape(b), now_s))
        try:
            mtime = os.stat(self.snapshot_path).st_mtime_ns
            if mtime == self._seen_ns:
                return
            snapshot = pickle.loads(self.snapshot_path.read_bytes())  # written by our own leader, 0700 dir
        except FileNotFoundError:
            return
        self._seen_ns = mtime
        self._follow_scaled(snapshot["scaled"])
        for url, (sample, sent_at_s) in snapshot["samples"].items():
            backend = self.pool.find(url)
            if backend is None or sent_at_s == backend.sample_time_s:
                continue
            before = [e for e, t in self._epoch_starts.get(url, ()) if t <= sent_at_s]
            self.pool.record_scrape(backend, sample, before[-1] if before else 0, sent_at_s)

    def _follow_scaled(self, specs: list[BackendSpec]) -> None:
        """Route to the replicas the leader's autoscaler serves from, and to no other it started."""
        from proxy.pool import BackendState

        urls = set()
        for spec in specs:
            backend = self.pool.find(spec.url)
            if backend is None or backend.state is BackendState.DRAINING:
                self.pool.add(spec, source=AUTOSCALED)
            urls.add(spec.url)
        for b in list(self.pool):
            if b.source == AUTOSCALED and b.url not in urls and b.state is not BackendState.DRAINING:
                self.pool.drain(b.url)

    def drop_scaled(self) -> None:
        """Becoming leader: the replicas followed so far were the dead leader's children and
        died with it; this worker's own autoscaler starts what the load needs."""
        for b in [b for b in self.pool if b.source == AUTOSCALED]:
            self.pool.drain(b.url)


class AdminJournal:
    """The admin API's changes as every worker applies them (see the module): JSON lines, appended
    under a file lock by the worker that made the change and read by the others from where they
    left off."""

    def __init__(self, run_dir: Path, pool: BackendPool,
                 on_added: Callable[[Backend], Coroutine[Any, Any, None]]) -> None:
        self.path = run_dir / "admin.jsonl"
        self.lock_path = run_dir / "admin.lock"
        self.pool = pool
        self.on_added = on_added
        self.offset = 0
        self._probes: set[asyncio.Task] = set()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with file_lock(self.lock_path):
            self.catch_up()
            yield

    def record(self, change: dict) -> None:
        with open(self.path, "ab") as f:
            f.write(json.dumps(change).encode() + b"\n")
            self.offset = f.tell()  # this worker applied it already

    def catch_up(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data.rfind(b"\n") + 1  # a line still being written is read next time
        for line in data[:complete].splitlines():
            try:
                self._apply(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:  # never stop the scrape round over one line
                log.warning("skipped an admin journal entry %r: %s", line[:200], exc)
        self.offset += complete

    def _apply(self, change: dict) -> None:
        from proxy.config import backend_from_mapping

        if change["op"] == "drain":
            self.pool.drain(change["url"])
            return
        backend = self.pool.add(backend_from_mapping(change["backend"]), source="admin")
        with contextlib.suppress(RuntimeError):  # no loop: the health rounds probe it
            task = asyncio.get_running_loop().create_task(self.on_added(backend))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)


def attach(app: web.Application, ctx: WorkerContext) -> Coordinator:
    """Make the proxy `app` one worker of several: shared in-flight work, the scrape snapshot,
    leader election, the admin journal, and the worker header."""
    from prometheus_client import Gauge

    from proxy.app import PROXY_KEY, add_response_header

    proxy = app[PROXY_KEY]
    ctx.load.row = ctx.index
    proxy.pool.share(ctx.load)
    leader = Gauge("flotilla_proxy_leader", "1 in the worker that scrapes the engines (labelled by pid)",
                   registry=proxy.metrics.registry, multiprocess_mode="liveall")
    leader.set(0)
    coordinator = Coordinator(ctx.run_dir, proxy.pool, proxy.config.scrape_interval_s,
                              on_lead=lambda: leader.set(1))
    proxy.scrape_loop = coordinator.run
    coordinator.every_round.append(proxy.metrics.flush)  # this worker's tally into the shared files
    if proxy.admin is not None:
        journal = proxy.admin.shared = AdminJournal(ctx.run_dir, proxy.pool, proxy.probe_now)
        coordinator.every_round.append(journal.catch_up)
    _lead_autoscaler(app, coordinator, ctx.load)
    add_response_header(app, WORKER_HEADER, str(os.getpid()))
    return coordinator


def _lead_autoscaler(app: web.Application, coordinator: Coordinator, load: SharedLoad) -> None:
    """The autoscaler runs in the leader only; the others' held requests wake it, and it counts
    every worker's arrivals and held requests (each worker publishes its own every round)."""
    from proxy.autoscale.setup import AUTOSCALER_KEY
    from proxy.autoscale.signals import ArrivalCounter

    runtime = app.get(AUTOSCALER_KEY)
    if runtime is None:
        return
    runtime.leader_only = True
    runtime.holder.on_wait = coordinator.wake
    coordinator.on_wake = runtime.request_replica
    own, everyone, before = runtime.arrivals, ArrivalCounter(), load.arrived()
    runtime.arrivals, runtime.total_held = everyone, load.total_held

    def count() -> None:
        load.publish_counts(before + own.count, runtime.holder.held)
        everyone.count = load.total_arrived()
        runtime.metrics.held.set(runtime.holder.held)  # a gauge's set_function is per process
    coordinator.every_round.append(count)
    leader_set = coordinator.on_lead
    starting: set[asyncio.Task] = set()

    def on_lead() -> None:
        leader_set()
        coordinator.drop_scaled()
        task = asyncio.get_running_loop().create_task(runtime.start(runtime.ttft))
        starting.add(task)
        task.add_done_callback(starting.discard)
    coordinator.on_lead = on_lead


def use_multiprocess_metrics(directory: Path) -> None:
    """Route every metric value of this process to files in `directory` (call before any metric
    is made; the parent made the directory)."""
    from prometheus_client import values

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    values.ValueClass = values.MultiProcessValue()


def _die_with_parent() -> None:
    """A worker ends when the parent does, even by SIGKILL (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Supervisor:
    """The parent: binds, forks the workers, restarts any that dies, stops them all on SIGTERM."""

    def __init__(self, workers: int, host: str, port: int, start_worker: Callable[[WorkerContext], int]) -> None:
        self.workers = workers
        self.host = host
        self.start_worker = start_worker
        self.reuse_port = has_reuse_port()
        # SO_REUSEPORT: bound, not listening (holds the port, takes no connection); else the one socket.
        self.sock = bind_socket(host, port, reuse_port=self.reuse_port, listen=not self.reuse_port)
        self.port = self.sock.getsockname()[1]
        self.run_dir = Path(tempfile.mkdtemp(prefix="flotilla-proxy-"))
        (self.run_dir / "metrics").mkdir()
        self.load = SharedLoad(workers, self.run_dir / "slots.lock")
        self.pids: dict[int, int] = {}
        """pid -> worker index."""
        self.stopping = False
        self.ready_r, self.ready_w = os.pipe()

    def spawn(self, index: int) -> int:
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                _die_with_parent()
                os.close(self.ready_r)
                ctx = WorkerContext(index=index, workers=self.workers, run_dir=self.run_dir, load=self.load,
                                    host=self.host, port=self.port,
                                    sock=None if self.reuse_port else self.sock, ready_fd=self.ready_w)
                if self.reuse_port:
                    self.sock.close()
                code = self.start_worker(ctx)
            except KeyboardInterrupt:
                code = 0
            except BaseException:
                log.exception("worker %d failed", index)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.pids[pid] = index
        return pid

    def run(self, on_listening: Callable[[str], None]) -> int:
        try:
            for index in range(self.workers):
                self.spawn(index)
            failed = self._wait_ready()
            if failed is not None:
                self._stop_all()
                return failed
            on_listening(f"http://{self.host}:{self.port}")
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
            self._supervise()
            return 0
        finally:
            self._stop_all()
            self.sock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _wait_ready(self, timeout_s: float = 120.0) -> int | None:
        """None once every worker listens; else the exit status of the first that died."""
        os.close(self.ready_w)
        deadline = time.monotonic() + timeout_s
        ready = 0
        os.set_blocking(self.ready_r, False)
        while ready < self.workers:
            try:
                ready += len(os.read(self.ready_r, 64))
            except BlockingIOError:
                pass
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                self.pids.pop(pid, None)
                return os.waitstatus_to_exitcode(status) or 1
            if time.monotonic() > deadline:
                return 1
            time.sleep(0.02)
        return None

    def _on_signal(self, _sig: int, _frame: object) -> None:
        self.stopping = True
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _supervise(self) -> None:
        from prometheus_client import multiprocess

        while self.pids:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                return
            index = self.pids.pop(pid, None)
            if index is None:
                continue
            self.load.zero_row(index)
            multiprocess.mark_process_dead(pid, str(self.run_dir / "metrics"))
            if not self.stopping:
                log.warning("proxy worker %d (pid %d) ended (%s); starting another", index, pid,
                            os.waitstatus_to_exitcode(status))
                time.sleep(RESTART_DELAY_S)
                if not self.stopping:
                    self.ready_r, self.ready_w = os.pipe()
                    self.spawn(index)
                    os.close(self.ready_w)
                    os.close(self.ready_r)

    def _stop_all(self) -> None:
        self.stopping = True
        for pid in list(self.pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in list(self.pids):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self.pids.pop(pid, None)
