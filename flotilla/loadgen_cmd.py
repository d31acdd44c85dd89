"""`flotilla loadgen`: replay a trace or a synthetic workload, convert traces, compare runs."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections.abc import Iterator
from pathlib import Path

from flotilla.cli_errors import fail

HELP = "replay traces or synthetic workloads against a URL; convert traces; compare runs"
DESCRIPTION = """\
Replay a trace or a synthetic workload open loop against an OpenAI-compatible URL and report
TTFT, TPOT, ITL, E2E, throughput and goodput (vLLM benchmark_serving definitions).

  flotilla loadgen --target http://127.0.0.1:8000 --trace conv.jsonl --speedup 10 --output run.json
  flotilla loadgen --target http://127.0.0.1:8000 --synthetic agents:sessions=6,turns=5,system=2000
  flotilla loadgen --target URL --synthetic poisson:rate=5,duration=60,input=512,output=128
  flotilla loadgen convert mooncake.jsonl trace.flotilla.jsonl
  flotilla loadgen compare a.json b.json --plot compare.png

Trace formats (recognised from the file, or --format): mooncake, azure, burstgpt, flotilla.

Figures are in modelled time when the target's look-alike engines name their time scale (the
x-flotilla-time-scale header, passed through the proxy): wall times / scale. A line above the
table says which clock; --time-scale X and --wall-time choose one. --slo is judged in that clock.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `flotilla loadgen`."""
    _add_subcommands(parser)
    src = parser.add_argument_group("workload")
    src.add_argument("--trace", help="trace file to replay")
    src.add_argument("--synthetic", metavar="SPEC", help="e.g. agents:sessions=6,turns=5,system=2000")
    _add_trace_options(src)
    run = parser.add_argument_group("replay")
    run.add_argument("--target", help="base URL, e.g. http://127.0.0.1:8000")
    run.add_argument("--model", help="model name (default: the target's first /v1/models entry)")
    run.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    run.add_argument("--speedup", type=float, default=1.0, help="divide trace time by this")
    run.add_argument("--max-requests", type=int, help="send at most this many requests")
    run.add_argument("--duration", type=float, metavar="SECONDS", help="send only within this many seconds")
    run.add_argument("--concurrency", type=int, help="cap on requests in flight (default: none, open loop)")
    run.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS", help="per-request timeout")
    run.add_argument("--no-ignore-eos", action="store_true", help="let the engine stop at EOS")
    run.add_argument("--replicas-metrics", metavar="URL",
                     help="router /metrics polled for ready replicas (default: TARGET/metrics)")
    out = parser.add_argument_group("results")
    clock = out.add_mutually_exclusive_group()
    clock.add_argument("--time-scale", type=float, metavar="X",
                       help="report modelled time: wall times / X (default: the scale the target's "
                            "look-alike engines name in x-flotilla-time-scale; wall time when they name none)")
    clock.add_argument("--wall-time", action="store_true", help="report wall-clock times even for a time-scaled target")
    out.add_argument("--slo", help="goodput SLOs in seconds of the reported time base, e.g. ttft=0.5,tpot=0.05")
    out.add_argument("--output", help="write the RunResult JSON here")
    out.add_argument("--plot", help="write latency CDFs and TTFT over time to this PNG")
    out.add_argument("--label", help="name of this run in tables and plots")
    out.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_trace_options(group: argparse._ActionsContainer) -> None:
    group.add_argument("--format", help="trace format: mooncake, azure, burstgpt, flotilla")
    group.add_argument("--seed", type=int, default=0, help="seed of synthetic workloads and jitter")
    group.add_argument("--jitter", type=float, default=0.0, metavar="SECONDS",
                       help="spread each arrival uniformly over this many seconds (e.g. 3 for Mooncake ticks)")


def _add_subcommands(parser: argparse.ArgumentParser) -> None:
    # without a subcommand, `flotilla loadgen` replays; the subcommands have their own options
    sub = parser.add_subparsers(dest="action", metavar="{convert,compare}")
    convert = sub.add_parser("convert", help="convert a trace to Flotilla JSONL")
    convert.add_argument("input", help="trace file in any known format")
    convert.add_argument("output", help="Flotilla JSONL file to write, or - for stdout")
    _add_trace_options(convert)
    compare = sub.add_parser("compare", help="side-by-side table of result files")
    compare.add_argument("results", nargs="+", help="RunResult JSON files")
    compare.add_argument("--plot", help="write latency CDFs of every run to this PNG")


def _fail(message: str) -> int:
    return fail("flotilla loadgen", message)


def run(args: argparse.Namespace) -> int:
    """Entry point of `flotilla loadgen`; returns the exit status."""
    from loadgen.readers import TraceFormatError

    actions = {None: _replay, "convert": _convert, "compare": _compare}
    try:
        return actions[getattr(args, "action", None)](args)
    except (TraceFormatError, ValueError, OSError, RuntimeError) as exc:
        return _fail(str(exc))


def _workload(args: argparse.Namespace) -> Iterator:
    from loadgen.arrivals import jittered
    from loadgen.readers import read_trace
    from loadgen.synthetic import synthetic_requests

    if bool(args.trace) == bool(args.synthetic):
        raise ValueError("give exactly one of --trace and --synthetic")
    reqs = read_trace(args.trace, args.format) if args.trace else synthetic_requests(args.synthetic, args.seed)
    if args.jitter:
        reqs = jittered(reqs, args.jitter, random.Random(args.seed))
    return reqs


def _convert(args: argparse.Namespace) -> int:
    from loadgen.readers import flotilla_jsonl

    args.trace, args.synthetic = args.input, None
    reqs = _workload(args)
    if args.output == "-":
        flotilla_jsonl.write(reqs, sys.stdout)
        return 0
    with open(args.output, "w", encoding="utf-8") as out:
        count = flotilla_jsonl.write(reqs, out)
    print(f"wrote {count} requests to {args.output}", file=sys.stderr)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from loadgen.report import compare_table
    from loadgen.results import RunResult

    results = []
    for path in args.results:
        try:
            res = RunResult.load(path)
        except (ValueError, KeyError, TypeError) as exc:  # not JSON, or JSON of another shape
            raise ValueError(f"{path}: not a result file of flotilla loadgen --output ({exc!r})") from None
        res.meta["label"] = Path(path).stem  # columns named as the user named the files
        results.append(res)
    print(compare_table(results))
    if args.plot:
        from loadgen.plots import plot_runs

        plot_runs(results, args.plot)
    return 0


def _check_url(flag: str, url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{flag} {url!r}: must be an http(s):// URL, e.g. http://127.0.0.1:8000")


def _config(args: argparse.Namespace):  # -> RunnerConfig, imported lazily
    from loadgen.runner import RunnerConfig
    from loadgen.stats import parse_slo
    from loadgen.timebase import check_scale

    if not args.target:
        raise ValueError("--target URL is required to replay")
    _check_url("--target", args.target)
    if args.time_scale is not None:
        check_scale(args.time_scale)  # fail before the run, not after it
    return RunnerConfig(
        target_url=args.target, model=args.model, endpoint=args.endpoint, speedup=args.speedup,
        max_requests=args.max_requests, duration_s=args.duration, concurrency=args.concurrency,
        request_timeout_s=args.timeout, ignore_eos=not args.no_ignore_eos,
        slo=parse_slo(args.slo) if args.slo else None,
        replicas_url=args.replicas_metrics or args.target.rstrip("/") + "/metrics",
        show_progress=not args.quiet,
        meta={"label": args.label or Path(args.trace or args.synthetic or "run").name,
              "trace": args.trace, "synthetic": args.synthetic, "seed": args.seed, "jitter_s": args.jitter},
    )


def _event_loop_runner():
    try:
        import uvloop

        return uvloop.run
    except ImportError:  # uvloop is not built for every platform
        return asyncio.run


def _replay(args: argparse.Namespace) -> int:
    from loadgen.report import summary_table
    from loadgen.runner import OpenLoopRunner
    from loadgen.timebase import SEEN_KEY, in_time_base, time_base

    cfg = _config(args)
    reqs = _workload(args)
    wall = _event_loop_runner()(OpenLoopRunner(cfg).run(reqs))
    base = time_base(wall.meta.get(SEEN_KEY, {}), args.time_scale, args.wall_time)
    result = in_time_base(wall, base)  # SLOs and goodput are judged in the base printed
    print(base.note)
    print(summary_table(result))
    if args.output:
        result.save(args.output)
    if args.plot:
        from loadgen.plots import plot_runs

        plot_runs([result], args.plot)
    return 0 if result.summary.num_ok else 1
