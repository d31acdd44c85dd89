"""Overhead of each router in front of one zero-latency backend (bench/overhead/backend.py):
added latency at fixed open-loop rates, streaming time to first byte, wrk's maximum requests per
second, and the router's CPU (its whole process tree) per 1,000 requests in every phase."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from bench import compiled
from bench.peers.launch import RouterSpec, launch
from bench.peers.load import Latencies, WrkResult, open_loop, run_wrk
from bench.peers.noise import GuardConfig, guarded
from bench.peers.procs import Proc, free_port, spawn, tree_cpu_s, wait_http

TARGETS = (RouterSpec("direct", "direct"), RouterSpec("nginx", "nginx"),
           RouterSpec("aiohttp floor", "floor"),
           RouterSpec("flotilla round-robin", "flotilla", "round-robin"),
           RouterSpec("flotilla round-robin --workers 2", "flotilla", "round-robin", workers=2),
           RouterSpec("flotilla round-robin (compiled)", "flotilla", "round-robin", compiled=True),
           RouterSpec("flotilla round-robin --workers 2 (compiled)", "flotilla", "round-robin", workers=2,
                      compiled=True),
           RouterSpec("flotilla round-robin --workers 2 --no-fast-path", "flotilla", "round-robin", workers=2,
                      flags=("--no-fast-path",)),
           RouterSpec("sglang-router round_robin", "sglang", "round_robin"),
           RouterSpec("vllm-router round_robin", "vllm-router", "round_robin"),
           RouterSpec("litellm simple-shuffle", "litellm", "simple-shuffle"))


@dataclass(frozen=True)
class OverheadConfig:
    """Rates and lengths of the phases."""

    low_rate: float = 20.0
    """Light open-loop rate, req/s."""
    high_rate: float = 200.0
    """Busy open-loop rate, req/s."""
    stream_rate: float = 100.0
    """Open-loop rate of the streaming (time to first byte) phase, req/s."""
    duration_s: float = 5.0
    """Length of each phase, s."""
    connections: int = 64
    """wrk's connections for the maximum rate."""
    rounds: int = 2

    def __post_init__(self) -> None:
        for name in ("low_rate", "high_rate", "stream_rate", "duration_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be > 0")
        if self.rounds < 1 or self.connections < 1:
            raise ValueError(f"rounds={self.rounds}, connections={self.connections}: must be >= 1")


@dataclass
class PhaseRecord:
    """One phase on one target in one round (the JSON rows)."""

    target: str
    phase: str
    """low, high, stream or max."""
    round: int
    p50_ms: float
    p99_ms: float
    rate_rps: float
    """Achieved requests per second."""
    requests: int
    errors: int
    router_cpu_s: float | None
    """utime + stime of the router's process tree over the phase; None for direct."""
    other_cores: float
    attempts: int
    noisy: bool
    """Others used more than the threshold even on the last try."""
    wall_s: float

    @property
    def cpu_ms_per_req(self) -> float | None:
        return None if self.router_cpu_s is None else 1000 * self.router_cpu_s / max(1, self.requests)


@dataclass
class Started:
    """A running target."""

    spec: RouterSpec
    url: str
    proc: Proc | None
    headers: dict[str, str] = field(default_factory=dict)
    startup_s: float = 0.0


def start_target(spec: RouterSpec, backend: str, workdir: Path) -> Started:
    if spec.kind == "direct":
        return Started(spec, backend, None)
    port = free_port()
    if spec.kind == "floor":
        proc = spawn(spec.label, [sys.executable, "-m", "bench.overhead.floor", "--port", str(port),
                                  "--backend", backend], workdir / "floor.log")
        url = f"http://127.0.0.1:{port}"
        return Started(spec, url, proc, startup_s=wait_http(url + "/ready", proc=proc))
    how = launch(spec, [backend], port, workdir, "bench")
    log = workdir / f"{spec.kind}-{spec.policy or 'plain'}{'-compiled' if spec.compiled else ''}.log"
    proc = spawn(spec.label, how.argv, log, env=how.env, cwd=how.cwd)
    headers: dict[str, str] = {}
    startup = wait_http(how.ready_url, timeout_s=90, proc=proc, headers=headers)
    return Started(spec, how.url, proc, headers, startup)


def _phase_fn(t: Started, phase: str, cfg: OverheadConfig, workdir: Path,
              tick: Callable[[], None]) -> Callable[[], Latencies | WrkResult]:
    url = t.url + "/v1/completions"
    rates = {"low": cfg.low_rate, "high": cfg.high_rate, "stream": cfg.stream_rate}
    if phase == "max":
        return lambda: run_wrk(url, cfg.duration_s, cfg.connections, workdir, t.headers)
    return lambda: asyncio.run(open_loop(url, rates[phase], cfg.duration_s, stream=phase == "stream",
                                         headers=t.headers, tick=tick))


def _settle(t: Started, idle_cores: float = 0.05, max_wait_s: float = 30.0) -> None:
    """Wait until the router is idle again, so a backlog of one phase does not spill into the next."""
    if t.proc is None:
        return
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        c0 = tree_cpu_s(t.proc.pid)
        time.sleep(0.5)
        if tree_cpu_s(t.proc.pid) - c0 < idle_cores * 0.5:
            return


def measure(t: Started, phase: str, rnd: int, cfg: OverheadConfig, guard: GuardConfig, workdir: Path,
            tick: Callable[[], None]) -> PhaseRecord:
    """One guarded phase, with the router's CPU counted around it."""
    cpu: list[float] = []

    def run() -> Latencies | WrkResult:
        c0 = tree_cpu_s(t.proc.pid) if t.proc else 0.0
        out = _phase_fn(t, phase, cfg, workdir, tick)()
        cpu.append(tree_cpu_s(t.proc.pid) - c0 if t.proc else 0.0)
        return out

    g = guarded(run, guard)
    _settle(t)
    v = g.value
    router_cpu = None if t.proc is None else cpu[-1]
    if isinstance(v, WrkResult):
        return PhaseRecord(t.spec.label, phase, rnd, v.p50_ms, v.p99_ms, v.rps, v.requests, v.errors, router_cpu,
                           g.other_cores, g.attempts, g.other_cores > guard.max_other_cores, g.wall_s)
    return PhaseRecord(t.spec.label, phase, rnd, v.pct(50), v.pct(99), v.rate, len(v.values_ms), v.errors,
                       router_cpu, g.other_cores, g.attempts, g.other_cores > guard.max_other_cores, g.wall_s)


PHASES = ("low", "high", "stream", "max")


def run_overhead(targets: list[RouterSpec], cfg: OverheadConfig, guard: GuardConfig,
                 workdir: Path) -> tuple[list[PhaseRecord], dict[str, float]]:
    """Every phase on every target, interleaved: within a round each phase visits all targets back to
    back (order reversed on odd rounds), so a busy spell on the machine touches all of them."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    backend_port = free_port()
    backend = spawn("backend", [sys.executable, "-m", "bench.overhead.backend", "--port", str(backend_port)],
                    workdir / "backend.log")
    started: list[Started] = []
    records: list[PhaseRecord] = []
    if any(spec.compiled for spec in targets):
        compiled.build()
    try:
        url = f"http://127.0.0.1:{backend_port}"
        wait_http(url + "/health", proc=backend)
        for spec in tqdm(targets, desc="starting routers", file=sys.stderr):
            started.append(start_target(spec, url, workdir))
        for t in started:  # warm connections and code paths
            asyncio.run(open_loop(t.url + "/v1/completions", 50, 1.0, headers=t.headers))
        per_round = sum(cfg.duration_s * r for r in (cfg.low_rate, cfg.high_rate, cfg.stream_rate))
        with tqdm(total=int(per_round * cfg.rounds * len(started)), unit="req", file=sys.stderr) as bar:
            for rnd in range(cfg.rounds):
                order = started if rnd % 2 == 0 else started[::-1]
                for phase in PHASES:
                    for t in order:
                        bar.set_description(f"round {rnd + 1} {phase} {t.spec.label}")
                        records.append(measure(t, phase, rnd + 1, cfg, guard, workdir, bar.update))
        return records, {t.spec.label: t.startup_s for t in started}
    finally:
        for t in started:
            if t.proc:
                t.proc.stop()
        backend.stop()


def to_json(records: list[PhaseRecord]) -> list[dict]:
    return [{**asdict(r), "cpu_ms_per_req": r.cpu_ms_per_req} for r in records]
