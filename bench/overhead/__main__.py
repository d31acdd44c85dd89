"""`python -m bench.overhead`: run the overhead benchmark and write docs/benchmarks.md."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from tqdm import tqdm

from bench.overhead.load import Latencies, closed_loop, open_loop
from bench.overhead.report import TargetResult, section, write_section

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    return subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def measure(name: str, base: str, args: argparse.Namespace, pid: int | None, bar: tqdm) -> TargetResult:
    url = base + "/v1/completions"
    await closed_loop(url, 8, 1.0)  # warm connections and code paths
    bar.set_description(f"{name}: {args.rate:g} req/s")
    c0 = cpu_s(pid) if pid else 0.0
    fixed = await open_loop(url, args.rate, args.duration_s, tick=lambda: bar.update())
    c1 = cpu_s(pid) if pid else 0.0
    bar.set_description(f"{name}: stream")
    stream = await open_loop(url, args.rate / 2, args.duration_s, stream=True, tick=lambda: bar.update())
    bar.set_description(f"{name}: max")
    c2 = cpu_s(pid) if pid else 0.0
    peak = await closed_loop(url, args.concurrency, args.duration_s)
    c3 = cpu_s(pid) if pid else 0.0
    bar.update(int(args.rate * args.duration_s))
    return TargetResult(
        name=name, p50_ms=fixed.pct(50), p99_ms=fixed.pct(99), ttfb_p50_ms=stream.pct(50),
        ttfb_p99_ms=stream.pct(99), max_rps=peak.rate, errors=fixed.errors + stream.errors + peak.errors,
        cpu_ms_per_req_at_rate=_per_req(c1 - c0, fixed) if pid else None,
        cpu_ms_per_req_at_max=_per_req(c3 - c2, peak) if pid else None,
    )


def _per_req(cpu: float, lat: Latencies) -> float:
    return 1000 * cpu / max(1, len(lat.values_ms))


async def run(args: argparse.Namespace) -> list[TargetResult]:
    backend_port, proxy_port = free_port(), free_port()
    backend = spawn(["-m", "bench.overhead.backend", "--port", str(backend_port)])
    backend_url = f"http://127.0.0.1:{backend_port}"
    proxy = spawn(["-m", "flotilla", "proxy", "--port", str(proxy_port), "--backend", backend_url,
                   "--policy", "least-outstanding"])
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    try:
        await wait_ready(backend_url + "/health")
        await wait_ready(proxy_url + "/ready")
        total = 2 * int(1.5 * args.rate * args.duration_s) + 2 * int(args.rate * args.duration_s)
        with tqdm(total=total, unit="req", file=sys.stderr) as bar:
            direct = await measure("direct", backend_url, args, None, bar)
            through = await measure("flotilla proxy", proxy_url, args, proxy.pid, bar)
        return [direct, through]
    finally:
        for p in (proxy, backend):
            p.terminate()
            p.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0, help="fixed request rate, req/s (default 200)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="length of each phase (default 5)")
    parser.add_argument("--concurrency", type=int, default=64, help="connections for max req/s (default 64)")
    parser.add_argument("--write", type=Path, default=REPO / "docs" / "benchmarks.md",
                        help="markdown file whose overhead section is replaced")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]  # other jobs on the machine skew every figure; say so
    try:
        import uvloop
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        results = runner.run(run(args))
    machine = (f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
               f"Python {platform.python_version()}, {platform.system()} {platform.release()}, "
               f"load average {load_before:.1f} before the run")
    command = "python -m bench.overhead " + " ".join(argv if argv is not None else sys.argv[1:])
    text = section(results, args.rate, args.duration_s, args.concurrency, machine, command.strip())
    print(text)
    if not args.no_write:
        write_section(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
