"""`python -m bench.overhead.instructions`: the proxy's CPU per request as a count of machine
instructions, which other jobs on the machine cannot skew.

CPU seconds per request move by a third between minutes on a shared machine (docs/benchmarks.md);
a change of a few percent to the request path cannot be seen in them. Here each target runs under
valgrind's callgrind: its counters are zeroed after a warm-up, then `--requests` non-streaming
completions go through it from `--concurrency` connections, and the user-space instructions the
target executed meanwhile, divided by the requests, are its cost. System calls are not counted
(the kernel's side of a read or write); they are the same for every target.

Targets: the pass-through on asyncio's protocols (the least any Python proxy spends), the plain
aiohttp proxy, and `flotilla proxy` with each policy named (and with `--compiled`, each again in
the compiled build: bench/compiled.py). With `--workers N`, each policy is counted again as
`flotilla proxy --workers N`: every worker runs under callgrind, and their instructions add up
(the supervisor's too, which serves nothing). Needs valgrind (Debian: `apt install valgrind`); the
target runs about fifty times slower under it, so a few thousand requests suffice.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from tqdm import tqdm

from bench import compiled
from bench.overhead.__main__ import REPO, free_port, spawn, wait_ready
from bench.overhead.report import replace_section
from bench.peers.procs import live_tree

START = "<!-- overhead-instructions:start -->"
END = "<!-- overhead-instructions:end -->"
BODY = b'{"model": "bench", "prompt": "hello", "max_tokens": 2}'
FLOORS = {"protocol floor": "bench.overhead.protocol_floor", "aiohttp floor": "bench.overhead.floor"}
COMPILED = " (compiled)"
"""The suffix of a target run from the compiled build."""
WORKERS = " --workers "
"""In a target's label: `flotilla proxy --workers N`, counted over every process."""
READY = {"protocol floor": "/health"}
"""Where each target says it is up (the protocol floor passes the engine's own /health through)."""


@dataclass
class Count:
    target: str
    requests: int
    instructions: int

    @property
    def per_request(self) -> float:
        return self.instructions / self.requests


def totals(dump: str) -> int:
    """The instructions a callgrind dump counted (its `totals:` line, else `summary:`)."""
    for key in ("totals", "summary"):
        m = re.search(rf"^{key}:\s*(\d+)", dump, re.M)
        if m:
            return int(m.group(1))
    raise ValueError("no totals in the callgrind dump")


async def send(url: str, requests: int, concurrency: int, tick=None) -> None:
    """`requests` completions from `concurrency` connections; every answer must be a 200."""
    left = requests

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url} answered {r.status}")
            if tick:
                tick()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))


def command(target: str, port: int, backend: str) -> list[str]:
    if target in FLOORS:
        return ["-m", FLOORS[target], "--port", str(port), "--backend", backend]
    policy, _, workers = target.removeprefix("flotilla ").removesuffix(COMPILED).partition(WORKERS)
    return ["-m", "flotilla", "proxy", "--port", str(port), "--backend", backend, "--policy", policy,
            "--log-level", "warning", *(["--workers", workers] if workers else [])]


async def count(target: str, backend: str, args: argparse.Namespace, workdir: Path, bar: tqdm) -> Count:
    port = free_port()
    out = workdir / f"cg-{port}"
    # every process of the target (the workers a supervisor forks) writes its own dump: cg-PORT.PID.1
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out}.%p",
                             sys.executable, *command(target, port, backend)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **_where(target))
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url + READY.get(target, "/ready"), timeout_s=args.start_timeout_s)
        await send(url + "/v1/completions", args.warmup, args.concurrency)
        pids = sorted(live_tree(proc.pid))
        for pid in pids:
            _control("-z", pid)
        await send(url + "/v1/completions", args.requests, args.concurrency, bar.update)
        for pid in pids:
            _control("-d", pid)
        dumps = [_wait_for(Path(f"{out}.{pid}.1")) for pid in pids]
        return Count(target, args.requests, sum(totals(d.read_text()) for d in dumps))
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _where(target: str) -> dict:
    """Popen's cwd and env for `target`: the compiled build's folder, or the working tree."""
    if target.endswith(COMPILED):
        return {"cwd": compiled.DEST, "env": {**os.environ, **compiled.env()}}
    return {"cwd": REPO}


def _control(flag: str, pid: int) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True)


def _wait_for(path: Path, timeout_s: float = 60.0) -> Path:
    """callgrind writes the dump when it next runs the target's code: wait until it is complete."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and re.search(r"^totals:|^summary:", path.read_text(), re.M):
            return path
        time.sleep(0.1)
    raise TimeoutError(f"callgrind wrote no dump to {path}")


def section(counts: list[Count], cmd: str) -> str:
    floor = counts[0].per_request
    rows = "\n".join(f"| {c.target} | {c.per_request / 1000:,.0f}k | {c.per_request / floor:.1f}x |" for c in counts)
    return f"""{START}
`{cmd}` (valgrind's callgrind: user-space instructions of the target's processes, every worker of
`--workers N` and its supervisor added up, after a warm-up, divided by the requests answered;
system calls are not counted)

| target | instructions per request | of the first row |
|---|---|---|
{rows}
{END}"""


async def run(args: argparse.Namespace) -> list[Count]:
    backend_port = free_port()
    backend = f"http://127.0.0.1:{backend_port}"
    proc = spawn(["-m", "bench.overhead.backend", "--port", str(backend_port)])
    flotillas = [*(f"flotilla {p}" for p in args.policies),
                 *(f"flotilla {p}{WORKERS}{n}" for n in args.workers for p in args.policies)]
    targets = [*([] if args.no_floor else FLOORS), *flotillas,
               *(f"{t}{COMPILED}" for t in flotillas if args.compiled)]
    if args.compiled:
        compiled.build()
    try:
        await wait_ready(backend + "/health")
        with tempfile.TemporaryDirectory() as tmp, \
                tqdm(total=len(targets) * args.requests, unit="req", file=sys.stderr) as bar:
            counts = []
            for target in targets:
                bar.set_description(target)
                counts.append(await count(target, backend, args, Path(tmp), bar))
            return counts
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead.instructions", description=__doc__)
    parser.add_argument("--policies", nargs="*", default=["round-robin", "prefix-aware"],
                        help="flotilla proxy policies to count (default: round-robin prefix-aware; none: "
                             "the floors only)")
    parser.add_argument("--requests", type=int, default=2000, help="requests counted per target (default 2000)")
    parser.add_argument("--warmup", type=int, default=300, help="requests before the count (default 300)")
    parser.add_argument("--concurrency", type=int, default=8, help="client connections (default 8)")
    parser.add_argument("--start-timeout-s", type=float, default=300.0,
                        help="how long a target may take to start under valgrind (default 300)")
    parser.add_argument("--compiled", action="store_true",
                        help="count each policy in the compiled build too (builds it: about a minute)")
    parser.add_argument("--workers", type=int, nargs="*", default=[],
                        help="count each policy again with `flotilla proxy --workers N`, for each N given")
    parser.add_argument("--no-floor", action="store_true", help="count only flotilla proxy")
    parser.add_argument("--write", type=Path, default=REPO / "docs" / "benchmarks.md",
                        help="markdown file whose instructions section is replaced")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.no_floor and not args.policies:
        parser.error("nothing to count: --no-floor with no --policies")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt install valgrind)", file=sys.stderr)
        return 2
    cmd = "python -m bench.overhead.instructions " + " ".join(argv if argv is not None else sys.argv[1:])
    counts = asyncio.run(run(args))
    text = section(counts, cmd.strip())
    print(text)
    if not args.no_write:
        replace_section(args.write, START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
