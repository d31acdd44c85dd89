"""`python -m bench.sim_speed`: simulate N requests of the Azure conversation sample and time it.

The run is pinned to one CPU (sched_setaffinity, as `taskset -c` would) so the figure is the
speed of one core. It prints requests and events per simulated second of wall and CPU time,
and writes the figures as JSON under bench/out/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from bench.sim_speed.workload import looped
from loadgen.trace import TraceRequest
from policies.routing.registry import create_policy
from sim.build import EngineSpec, job_factory, replica_factory
from sim.fleet import FleetSim

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "data" / "traces" / "AzureLLMInferenceTrace_conv.before1845.csv"
GOAL_S = 60.0
"""The goal: 100,000 requests in under a minute on one core."""


@dataclass
class SpeedResult:
    """One timed simulation."""

    requests: int
    """Requests simulated (all finished)."""
    replicas: int
    policy: str
    engine: str
    events: int
    """Events the simulator's heap ran."""
    engine_steps: int
    """Engine steps the replicas' cores finished."""
    virtual_s: float
    """Simulated time, seconds."""
    wall_s: float
    """Wall-clock seconds of the simulation (trace reading included)."""
    cpu_s: float
    """CPU seconds of this process over the same span."""
    requests_per_s: float
    """Requests per wall second."""
    events_per_s: float
    """Events per wall second."""
    cpus: str
    """CPUs the run was allowed on."""
    machine: str
    """CPU model and count."""


def pin_one_cpu() -> str:
    """Restrict this process to its first allowed CPU; returns the CPU list it runs on."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    return "unpinned"


def machine() -> str:
    model = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def with_progress(requests: Iterable[TraceRequest], total: int, show: bool) -> Iterator[TraceRequest]:
    # arrivals are pulled as virtual time reaches them, so this bar tracks the simulation
    yield from tqdm(requests, total=total, unit="req", disable=not show, mininterval=1.0)


def run(trace: Path, num_requests: int, replicas: int, policy: str, show_progress: bool) -> SpeedResult:
    cpus = pin_one_cpu()
    # the engine fake-vllm serve starts on an H100, with the simulator's faster block key
    spec = EngineSpec(kind="vllm", model="llama-3.1-8b", gpu="h100", scheduler={"prefix_caching_hash_algo": "builtin"})
    wall0, cpu0 = time.perf_counter(), time.process_time()
    sim = FleetSim(make_replica=replica_factory(spec), num_replicas=replicas,
                   policy=create_policy(policy, rng=random.Random(0)), make_job=job_factory(spec))
    result = sim.run(with_progress(looped(trace, num_requests), num_requests, show_progress), label=policy)
    wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    meta = result.meta
    steps = sum(r.core.stats().num_steps for r in sim.replicas if hasattr(r, "core"))
    return SpeedResult(
        requests=result.summary.num_requests, replicas=replicas, policy=policy, engine="vllm llama-3.1-8b h100",
        events=meta["events"], engine_steps=steps, virtual_s=meta["virtual_duration_s"],
        wall_s=wall_s, cpu_s=cpu_s, requests_per_s=result.summary.num_requests / wall_s,
        events_per_s=meta["events"] / wall_s, cpus=cpus, machine=machine())


def table(r: SpeedResult) -> str:
    rows = [("requests", f"{r.requests:,}"), ("replicas / policy", f"{r.replicas} / {r.policy}"),
            ("engine steps", f"{r.engine_steps:,}"), ("events", f"{r.events:,}"),
            ("virtual time", f"{r.virtual_s:,.0f} s"), ("wall", f"{r.wall_s:.1f} s"),
            ("CPU", f"{r.cpu_s:.1f} s"), ("requests/s", f"{r.requests_per_s:,.0f}"),
            ("events/s", f"{r.events_per_s:,.0f}"), ("CPUs", r.cpus)]
    return "\n".join(f"{k:<18} {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim_speed", description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000, help="requests to simulate")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--policy", default="round-robin")
    parser.add_argument("--trace", type=Path, default=TRACE, help="trace to loop (any loadgen format)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "sim_speed.json")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        r = run(args.trace, args.requests, args.replicas, args.policy, not args.quiet)
    finally:  # a caller in the same process (a test) gets its CPUs back
        if allowed is not None:
            os.sched_setaffinity(0, allowed)
    print(table(r))
    goal = "met" if r.requests >= 100_000 and r.wall_s < GOAL_S else "not met"
    print(f"goal (100,000 requests in < {GOAL_S:.0f} s on one core): {goal}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(r), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
