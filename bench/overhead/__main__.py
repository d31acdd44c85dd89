"""`python -m bench.overhead`: run the overhead benchmark and write docs/benchmarks.md."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from tqdm import tqdm

from bench.overhead import long_prompt
from bench.overhead.load import Latencies, closed_loop, open_loop
from bench.overhead.report import TargetResult, section, write_section

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` and its children (the workers of
    `--workers N`)."""
    from bench.peers.procs import tree_cpu_s

    return tree_cpu_s(pid)


async def wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready")


def spawn(args: list[str]) -> subprocess.Popen:
    # Output goes nowhere: an unread pipe could fill and stall the process being measured.
    return subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def busy_share(interval_s: float = 1.0) -> float:
    """Share of all CPUs busy over `interval_s`, from /proc/stat."""
    def snap() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + values[4]
        return sum(values) - idle, sum(values)
    busy0, total0 = snap()
    time.sleep(interval_s)
    busy1, total1 = snap()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_quiet(max_wait_s: float, busy_below: float) -> float:
    """Wait (up to `max_wait_s`) until other jobs leave the CPUs mostly idle; return the busy share seen."""
    deadline = time.monotonic() + max_wait_s
    share = busy_share()
    while share >= busy_below and time.monotonic() < deadline:
        share = busy_share()
    return share


@dataclass
class Target:
    """One way to reach the backend, and what its phases measured so far (one entry per round)."""

    name: str
    url: str
    pid: int | None
    """The proxy's process, whose CPU is counted; None for the direct connection."""
    fixed: list[Latencies] = field(default_factory=list)
    stream: list[Latencies] = field(default_factory=list)
    peak: list[Latencies] = field(default_factory=list)
    cpu_fixed_ms: list[float] = field(default_factory=list)
    cpu_peak_ms: list[float] = field(default_factory=list)


async def _timed(target: Target, run: Awaitable[Latencies]) -> tuple[Latencies, float | None]:
    c0 = cpu_s(target.pid) if target.pid else 0.0
    lat = await run
    return lat, (_per_req(cpu_s(target.pid) - c0, lat) if target.pid else None)


async def one_round(targets: list[Target], args: argparse.Namespace, bar: tqdm) -> None:
    """Each phase runs on every target back to back, so a busy spell on the machine hits both."""
    for t in targets:
        bar.set_description(f"{t.name}: {args.rate:g} req/s")
        lat, cpu = await _timed(t, open_loop(t.url, args.rate, args.duration_s, tick=bar.update))
        t.fixed.append(lat)
        if cpu is not None:
            t.cpu_fixed_ms.append(cpu)
    for t in targets:
        bar.set_description(f"{t.name}: stream")
        t.stream.append(await open_loop(t.url, args.rate / 2, args.duration_s, stream=True, tick=bar.update))
    for t in targets:
        bar.set_description(f"{t.name}: max")
        lat, cpu = await _timed(t, closed_loop(t.url, args.concurrency, args.duration_s))
        t.peak.append(lat)
        if cpu is not None:
            t.cpu_peak_ms.append(cpu)
        bar.update(int(args.rate * args.duration_s))


def summarize(t: Target) -> TargetResult:
    """Median over rounds of each figure."""
    med = statistics.median
    return TargetResult(
        name=t.name, p50_ms=med(x.pct(50) for x in t.fixed), p99_ms=med(x.pct(99) for x in t.fixed),
        ttfb_p50_ms=med(x.pct(50) for x in t.stream), ttfb_p99_ms=med(x.pct(99) for x in t.stream),
        max_rps=med(x.rate for x in t.peak), errors=sum(x.errors for x in t.fixed + t.stream + t.peak),
        cpu_ms_per_req_at_rate=med(t.cpu_fixed_ms) if t.cpu_fixed_ms else None,
        cpu_ms_per_req_at_max=med(t.cpu_peak_ms) if t.cpu_peak_ms else None,
    )


def _per_req(cpu: float, lat: Latencies) -> float:
    return 1000 * cpu / max(1, len(lat.values_ms))


async def run(args: argparse.Namespace, quiet: list[float]) -> list[TargetResult]:
    """Measure every target; `quiet` receives the machine's busy share before each round."""
    backend_port, proxy_port, floor_port = free_port(), free_port(), free_port()
    backend_url = f"http://127.0.0.1:{backend_port}"
    procs = [spawn(["-m", "bench.overhead.backend", "--port", str(backend_port)])]
    targets = [Target("direct", backend_url, None)]
    if not args.no_floor:
        procs.append(spawn(["-m", "bench.overhead.floor", "--port", str(floor_port), "--backend", backend_url]))
        targets.append(Target("plain aiohttp proxy (floor)", f"http://127.0.0.1:{floor_port}", procs[-1].pid))
    for workers in args.workers:
        port = proxy_port if workers == args.workers[0] else free_port()
        procs.append(spawn(["-m", "flotilla", "proxy", "--port", str(port), "--backend", backend_url,
                            "--policy", "least-outstanding", "--workers", str(workers)]))
        label = "flotilla proxy" + (f" --workers {workers}" if len(args.workers) > 1 else "")
        targets.append(Target(label, f"http://127.0.0.1:{port}", procs[-1].pid))
    try:
        await wait_ready(backend_url + "/health")
        for t in targets[1:]:
            await wait_ready(t.url + "/ready")
        for t in targets:
            t.url += "/v1/completions"
            await closed_loop(t.url, 8, 1.0)  # warm connections and code paths
        total = args.rounds * len(targets) * int(2.5 * args.rate * args.duration_s)
        with tqdm(total=total, unit="req", file=sys.stderr) as bar:
            for _ in range(args.rounds):
                quiet.append(await asyncio.to_thread(wait_quiet, args.quiet_wait_s, 0.3))
                await one_round(targets, args, bar)
        return [summarize(t) for t in targets]
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0, help="fixed request rate, req/s (default 200)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="length of each phase (default 5)")
    parser.add_argument("--concurrency", type=int, default=64, help="connections for max req/s (default 64)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all phases; medians are reported")
    parser.add_argument("--quiet-wait-s", type=float, default=30.0,
                        help="before each round, wait up to this long for other jobs to leave the CPUs idle")
    parser.add_argument("--write", type=Path, default=REPO / "docs" / "benchmarks.md",
                        help="markdown file whose overhead section is replaced")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--workers", type=int, nargs="+", default=[1], metavar="N",
                        help="measure flotilla proxy with each of these --workers counts (default 1)")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the plain aiohttp proxy that shows the floor of any aiohttp proxy")
    long_prompt.add_arguments(parser)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]  # other jobs on the machine skew every figure; say so
    command = "python -m bench.overhead " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.long_prompt:
        return _long_prompt(args, load_before, command.strip())
    with _runner() as runner:
        quiet: list[float] = []
        results = runner.run(run(args, quiet))
    machine = (f"{_machine(load_before)}, CPUs "
               f"{', '.join(f'{100 * q:.0f} %' for q in quiet)} busy just before each round")
    text = section(results, args.rate, args.duration_s, args.concurrency, args.rounds, machine, command.strip())
    print(text)
    if not args.no_write:
        write_section(args.write, text)
    return 0


def _runner() -> asyncio.Runner:
    try:
        import uvloop
        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        return asyncio.Runner()


def _machine(load_before: float) -> str:
    return (f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
            f"Python {platform.python_version()}, {platform.system()} {platform.release()}, "
            f"load average {load_before:.1f} before the run")


def _long_prompt(args: argparse.Namespace, load_before: float, command: str) -> int:
    quiet = wait_quiet(args.quiet_wait_s, 0.3)
    with _runner() as runner, tqdm(total=len(args.policies) * len(long_prompt.KINDS), file=sys.stderr) as bar:
        results = runner.run(long_prompt.run(args, spawn, free_port, wait_ready, bar))
    text = long_prompt.section(results, args, f"{_machine(load_before)}, CPUs {100 * quiet:.0f} % busy at the start",
                               command)
    print(text)
    if not args.no_write:
        long_prompt.write(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
