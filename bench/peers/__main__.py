"""`python -m bench.peers install | overhead | quality`: Flotilla beside sglang-router, vllm-router,
LiteLLM and nginx, on the same backends and the same traffic, in one command each."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from bench.peers import install as installer
from bench.peers import overhead_report, quality_report
from bench.peers.launch import REPO
from bench.peers.noise import GuardConfig
from bench.peers.report import write_block

NETNS_ENV = "FLOTILLA_PEERS_NETNS"


def enter_netns(name: str, argv: list[str]) -> None:
    """Re-run this command inside a network namespace with only `lo` up, so no router can reach
    outside (sglang-router fetches a tokenizer, LiteLLM a cost map). Returns only if already inside."""
    if os.environ.get(NETNS_ENV) == name:
        return
    if subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split().count(name) == 0:
        subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    os.environ[NETNS_ENV] = name
    os.execvp("ip", ["ip", "netns", "exec", name, sys.executable, "-m", "bench.peers", *argv])


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    return (f"{os.cpu_count()} CPUs ({model}), {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') >> 30} GiB, "
            f"Linux {platform.release()}, Python {platform.python_version()}, load average "
            f"{os.getloadavg()[0]:.1f} at the start")


def versions_line() -> str:
    return ", ".join(f"{k} {v}" for k, v in installer.versions().items())


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--netns", default="flotilla-peers", help="loopback-only network namespace to run in")
    p.add_argument("--no-netns", action="store_true", help="run in the current network namespace")
    p.add_argument("--max-other-cores", type=float, default=0.2,
                   help="repeat a phase when other processes used more cores than this (default 0.2)")
    p.add_argument("--attempts", type=int, help="tries per noisy phase")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="JSON and logs (default bench/out)")
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    p.add_argument("--img", type=Path, default=REPO / "docs" / "img")
    p.add_argument("--no-write", action="store_true", help="print the table; leave docs/ alone")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="install the peers into bench/.peers/ and nginx + wrk (idempotent)")
    r = sub.add_parser("report", help="rebuild the tables, plots and docs blocks from bench/out/peers-*.json")
    r.add_argument("--out", type=Path, default=REPO / "bench" / "out")
    o = sub.add_parser("overhead", help="added latency, TTFB, max req/s and CPU per request")
    _common(o)
    o.add_argument("--duration-s", type=float, default=5.0, help="length of each phase (default 5)")
    o.add_argument("--only", nargs="*", help="labels of the targets to run (default all)")
    q = sub.add_parser("quality", help="TTFT, E2E, prefix-cache hit rate and goodput on trace slices")
    _common(q)
    q.add_argument("--only", nargs="*", help="labels of the routers to run (default all)")
    q.add_argument("--workloads", nargs="*", help="names of the workloads (default all)")
    a = sub.add_parser("agreement", help="sglang-router cache_aware vs the sglang-cache-aware policy, decision by decision")
    a.add_argument("--requests", type=int, help="requests per run (default 1000)")
    a.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="JSON and logs (default bench/out)")
    a.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    a.add_argument("--no-write", action="store_true", help="print the table; leave docs/ alone")
    return p


def _guard(args: argparse.Namespace, default_attempts: int) -> GuardConfig:
    return GuardConfig(max_other_cores=args.max_other_cores, attempts=args.attempts or default_attempts)


def cmd_overhead(args: argparse.Namespace, command: str) -> str:
    from bench.peers.overhead import TARGETS, OverheadConfig, run_overhead, to_json
    cfg = OverheadConfig(duration_s=args.duration_s, rounds=args.rounds)
    targets = [t for t in TARGETS if not args.only or t.label in args.only or t.label == "direct"]
    where = machine()
    records, startup = run_overhead(targets, cfg, _guard(args, 2), args.out / "peers-overhead")
    rows = to_json(records)
    (args.out / "peers-overhead.json").write_text(json.dumps(
        {"command": command, "machine": where, "config": vars(cfg), "startup_s": startup, "phases": rows}, indent=1))
    rates = {"low": cfg.low_rate, "high": cfg.high_rate, "stream": cfg.stream_rate}
    text = overhead_text(command, where, overhead_report.tables(rows, rates), startup, cfg, args)
    if not args.no_write:
        args.img.mkdir(parents=True, exist_ok=True)
        overhead_report.plot(rows, args.img / "peers-overhead.png")
        write_block(args.doc, "peers-overhead", text)
    return text


def overhead_text(command: str, where: str, table: str, startup: dict, cfg: object, args: argparse.Namespace) -> str:
    starts = ", ".join(f"{k} {v:.1f} s" for k, v in startup.items() if k != "direct")
    return f"""## Peer routers: overhead

`{command}` ({'inside a loopback-only network namespace' if not args.no_netns else 'on the host network'})

Machine: {where}. Peers: {versions_line()}.

One zero-latency backend (`bench/overhead/backend.py`) behind each router; `direct` is the
backend itself. Phases: open loop at {cfg.low_rate:g} and {cfg.high_rate:g} req/s non-streaming,
{cfg.stream_rate:g} req/s streaming (time to the first SSE event; 16 chunks, `[DONE]` checked),
then `wrk -t1 -c{cfg.connections}` for the maximum rate; {cfg.duration_s:g} s each. Every phase
visits every target back to back ({cfg.rounds} rounds, order reversed on odd rounds). Router CPU is
utime + stime of the router's whole process tree from `/proc`, per request answered. Noise guard:
after each phase, busy CPU from `/proc/stat` minus this benchmark's own processes gives the cores
other jobs used; above {args.max_other_cores:g} the phase is repeated (the quietest try is kept,
{NOISY_NOTE}). Cells are the median over rounds with the [min–max] spread. Routers use their
round-robin policy (LiteLLM: simple-shuffle, one worker, no master key); nginx-light runs 2
workers, upstream keep-alive, buffering off. Startup to ready: {starts}. The second table, when
vllm-router ran, divides each router's max req/s by vllm-router's in the same round: the targets
of a round run back to back, so a slow spell that spans a round cancels there.

![overhead](img/peers-overhead.png)

{table}
"""


NOISY_NOTE = "† marks a target with a phase still above it after every try; repeats in brackets"


def cmd_quality(args: argparse.Namespace, command: str) -> str:
    from bench.peers.quality import ROUTERS, WORKLOADS, FleetConfig, run_quality
    cfg = FleetConfig()
    routers = [r for r in ROUTERS if not args.only or r.label in args.only]
    workloads = [w for w in WORKLOADS if not args.workloads or w.name in args.workloads]
    where = machine()
    records = run_quality(routers, workloads, cfg, _guard(args, 1), args.rounds, args.out / "peers-quality")
    rows = [vars(r) for r in records]
    (args.out / "peers-quality.json").write_text(json.dumps(
        {"command": command, "machine": where, "fleet": vars(cfg), "runs": rows}, indent=1))
    tables = "\n\n".join(_workload_table(w, rows, cfg) for w in workloads)
    text = quality_text(command, where, tables, cfg, args)
    if not args.no_write:
        args.img.mkdir(parents=True, exist_ok=True)
        quality_report.plot(rows, [w.name for w in workloads], args.img / "peers-quality.png")
        write_block(args.doc, "peers-quality", text)
    return text


def _workload_table(w: object, rows: list[dict], cfg: object) -> str:
    return (f"**{w.name}** (`flotilla loadgen {' '.join(_rel(a) for a in w.args)} --speedup "
            f"{1 / cfg.time_scale:g}`)\n\n{quality_report.table(rows, w.name)}")


def _rel(arg: str) -> str:
    """Paths in the doc relative to the repository root."""
    return arg.removeprefix(str(REPO) + "/")


def quality_text(command: str, where: str, tables: str, cfg: object, args: argparse.Namespace) -> str:
    return f"""## Peer routers: routing quality

`{command}`

Machine: {where}. Peers: {versions_line()}.

Each run starts a fresh fleet of {cfg.engines} look-alike vLLM engines (`fake-vllm serve
llama-3.1-8b --gpu {cfg.gpu} --time-scale {cfg.time_scale:g}`, prefix caching on, empty caches),
a fresh router, and replays one workload with `flotilla loadgen` at speedup {1 / cfg.time_scale:g}
(so each engine sees the trace's real load, {1 / cfg.time_scale:g}× faster than an H100 would
serve it). Times below are measured, i.e. time-scaled: multiply by {1 / cfg.time_scale:g} for
H100 time; a router's own per-request cost is not scaled and so weighs {1 / cfg.time_scale:g}× more
here than in front of a real fleet. Prefix-cache hit rate is the fleet's
`vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total`, scraped before and after.
Goodput counts requests with TTFT ≤ {cfg.slo_ttft_s * 1000:g} ms and TPOT ≤ {cfg.slo_tpot_s * 1000:g} ms
measured ({cfg.slo_ttft_s / cfg.time_scale:g} s and {cfg.slo_tpot_s / cfg.time_scale * 1000:g} ms of H100 time).
Each peer runs its best policy for these workloads (sglang-router and vllm-router `cache_aware`,
LiteLLM `least-busy`); Flotilla runs each of its policies that matters. {args.rounds} rounds,
workloads and routers interleaved (router order reversed on odd rounds); cells are the median with
the [min–max] over rounds; the engine split is each engine's share of the queried prompt tokens.
The noise guard is reported, not enforced, here (runs are long): others' cores is the most any run
saw, † above {args.max_other_cores:g}.

![routing quality](img/peers-quality.png)

{tables}
"""


def cmd_agreement(args: argparse.Namespace, command: str) -> str:
    from dataclasses import replace

    from bench.peers.agreement import CONFIGS, router_version, run_agreement, table
    configs = [replace(c, requests=args.requests) if args.requests else c for c in CONFIGS]
    outcomes = run_agreement(configs, args.out / "peers-agreement")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers-agreement.json").write_text(json.dumps(
        {"command": command, "sglang-router": router_version(), "runs": [vars(o) for o in outcomes]}, indent=1))
    text = agreement_text(command, table(outcomes), configs[0], router_version())
    if not args.no_write:
        write_block(args.doc, "peers-agreement", text)
    return text


def agreement_text(command: str, table: str, cfg: object, version: str) -> str:
    return f"""## sglang-cache-aware against the real sglang-router

`{command}`

sglang-router {version} (sgl-model-gateway 0.3.2, lightseekorg/smg c7f9bf9), policy `cache_aware`
with its defaults, in front of {cfg.backends} look-alike backends that report which request reached
them and hold it until the script completes it (`bench/peers/agreement.py`). One seeded sequence of
{cfg.requests} completions requests (multi-turn sessions of one to six turns over eight shared
system prompts, 15 % one-off prompts; after each arrival every open request completes with probability
{cfg.release_p:g}) goes through the router, and the same arrivals and completions through the
Flotilla policy, which sees its own placements as its loads and its backends in the router's
worker-list order (`GET /workers`), so ties fall where SGLang's rule (the first worker in its
list) puts them. Each request is sent once the router's loads (`GET /workers`) equal the script's,
so the run is deterministic. Eviction is not exercised: the router evicts on a 60 s timer down to
2^26 characters per worker, which this run never reaches. The last row is a control: Flotilla's
`prefix-aware` against the same router.

{table}
"""


def cmd_report(out: Path) -> int:
    """Re-render from saved JSON: the same text the run wrote, without running anything."""
    from bench.peers.overhead import OverheadConfig
    from bench.peers.quality import WORKLOADS, FleetConfig
    if (path := out / "peers-overhead.json").exists():
        data = json.loads(path.read_text())
        args = parser().parse_args(shlex.split(data["command"])[3:])
        cfg = OverheadConfig(**data["config"])
        rates = {"low": cfg.low_rate, "high": cfg.high_rate, "stream": cfg.stream_rate}
        table = overhead_report.tables(data["phases"], rates)
        overhead_report.plot(data["phases"], args.img / "peers-overhead.png")
        write_block(args.doc, "peers-overhead",
                    overhead_text(data["command"], data["machine"], table, data["startup_s"], cfg, args))
    if (path := out / "peers-quality.json").exists():
        data = json.loads(path.read_text())
        args = parser().parse_args(shlex.split(data["command"])[3:])
        cfg, rows = FleetConfig(**data["fleet"]), data["runs"]
        names = list(dict.fromkeys(r["workload"] for r in rows))
        tables = "\n\n".join(_workload_table(w, rows, cfg) for w in WORKLOADS if w.name in names)
        quality_report.plot(rows, names, args.img / "peers-quality.png")
        write_block(args.doc, "peers-quality", quality_text(data["command"], data["machine"], tables, cfg, args))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.cmd == "install":
        return installer.main()
    if args.cmd == "report":
        return cmd_report(args.out)
    if args.cmd == "agreement":
        print(cmd_agreement(args, "python -m bench.peers " + " ".join(argv)))
        return 0
    if not args.no_netns and shutil.which("ip"):
        enter_netns(args.netns, argv)
    command = "python -m bench.peers " + shlex.join(argv)  # labels after --only have spaces
    args.out.mkdir(parents=True, exist_ok=True)
    text = cmd_overhead(args, command) if args.cmd == "overhead" else cmd_quality(args, command)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
