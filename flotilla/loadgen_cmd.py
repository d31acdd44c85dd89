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
    out.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                     help="goodput SLOs as vllm bench serve spells them: ttft:500 tpot:50 e2el:10000 (milliseconds)")
    add_result_options(out)
    out.add_argument("--output", help="write the result here, in --output-format")
    out.add_argument("--plot", help="write latency CDFs and TTFT over time to this PNG")
    out.add_argument("--label", help="name of this run in tables and plots")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep = parser.add_argument_group("rate sweep")
    sweep.add_argument("--sweep", type=int, metavar="N",
                       help="guidellm's sweep: a synchronous run, a throughput run, then N constant rates "
                            "evenly spaced between their throughputs; one table, and with --plot the "
                            "throughput-latency curve; --output names the files (PATH-<run>.json)")


def add_result_options(group: argparse._ActionsContainer) -> None:
    """--percentiles, --percentile-metrics and --output-format: shared with `flotilla sim`."""
    group.add_argument("--percentiles", "--metric-percentiles", dest="percentiles", default="50,90,99",
                       metavar="P,P,...", help="percentiles of every latency in the summary and exports "
                                               "(default 50,90,99; e.g. 50,90,99,99.9)")
    group.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el", metavar="M,M,...",
                       help="metrics of a vllm-bench export, as vllm bench serve names them (default ttft,tpot,itl,e2el)")
    group.add_argument("--output-format", choices=("json", "vllm-bench", "csv"),
                       help="json: Flotilla's result schema; vllm-bench: the keys and units of "
                            "vllm bench serve --save-result; csv: one row per request, summary in "
                            "PATH.summary.csv (default: csv for a .csv path, else json)")


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
    compare.add_argument("--label", action="append", default=[],
                         help="column name of each run, in the order given (repeat; default: the label each run "
                              "was saved with, else its file name)")


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

    if args.label and len(args.label) != len(args.results):
        raise ValueError(f"--label given {len(args.label)} times for {len(args.results)} result files: one per file")
    results = []
    for path in args.results:
        try:
            results.append(RunResult.load(path))
        except (ValueError, KeyError, TypeError) as exc:  # not JSON, or JSON of another shape
            raise ValueError(f"{path}: not a result file of flotilla loadgen --output ({exc!r})") from None
    for res, label in zip(results, compare_labels(results, args.results, args.label), strict=True):
        res.meta["label"] = label
    print(compare_table(results))
    if args.plot:
        from loadgen.plots import plot_runs

        plot_runs(results, args.plot)
    return 0


def compare_labels(results: list, paths: list[str], given: list[str]) -> list[str]:  # type: ignore[type-arg]
    """Column names: `--label`s when given; else each run's saved label, or its file name where
    the run has none or two runs share one."""
    if given:
        return list(given)
    saved = [str(r.meta.get("label") or "") for r in results]
    return [label if label and saved.count(label) == 1 else Path(path).stem
            for label, path in zip(saved, paths, strict=True)]


def _check_url(flag: str, url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{flag} {url!r}: must be an http(s):// URL, e.g. http://127.0.0.1:8000")


def _config(args: argparse.Namespace):  # -> RunnerConfig, imported lazily
    from loadgen.provenance import run_meta
    from loadgen.runner import RunnerConfig
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
        slo=_slo(args),
        replicas_url=args.replicas_metrics or args.target.rstrip("/") + "/metrics",
        show_progress=not args.quiet,
        meta={"label": args.label or Path(args.trace or args.synthetic or "run").name,
              "trace": args.trace, "synthetic": args.synthetic, "seed": args.seed, "jitter_s": args.jitter,
              "endpoint": args.endpoint, "max_concurrency": args.concurrency, **run_meta(args.trace, getattr(args, "argv", None))},
    )


def _slo(args: argparse.Namespace):  # -> Slo | None, imported lazily
    from loadgen.stats import parse_slo

    if args.slo and args.goodput:
        raise ValueError("--slo and --goodput: choose one")
    if args.goodput:  # vLLM's KEY:MILLISECONDS pairs
        pairs = [p.partition(":") for p in args.goodput]
        if any(not sep for _, sep, _ in pairs):
            raise ValueError(f"bad --goodput {' '.join(args.goodput)!r}: expected KEY:MS pairs, e.g. ttft:500 tpot:50")
        return parse_slo(",".join(f"{k}={float(v) / 1000:g}" for k, _, v in pairs))
    return parse_slo(args.slo) if args.slo else None


def _event_loop_runner():
    try:
        import uvloop

        return uvloop.run
    except ImportError:  # uvloop is not built for every platform
        return asyncio.run


def _replay(args: argparse.Namespace) -> int:
    from loadgen.export import parse_percentile_metrics
    from loadgen.report import summary_table
    from loadgen.runner import OpenLoopRunner
    from loadgen.stats import parse_percentiles

    percentiles, metrics = parse_percentiles(args.percentiles), parse_percentile_metrics(args.percentile_metrics)
    cfg = _config(args)
    if args.sweep is not None:
        return _sweep(args, cfg, percentiles, metrics)
    if cfg.show_progress:
        cfg.expected_requests = _count(args)
    reqs = _workload(args)
    wall = _event_loop_runner()(OpenLoopRunner(cfg).run(reqs))
    result, note = _reported(wall, args, percentiles)
    print(note)
    print(summary_table(result))
    if args.output:
        _save(result, args.output, args.output_format, metrics)
    if args.plot:
        from loadgen.plots import plot_runs

        plot_runs([result], args.plot)
    return 0 if result.summary.num_ok else 1


def _count(args: argparse.Namespace) -> int | None:
    """Requests the workload holds (up to --max-requests): the progress bar's total."""
    count = 0
    for count, _ in enumerate(_workload(args), start=1):
        if args.max_requests is not None and count >= args.max_requests:
            break
    return count


def _reported(wall, args: argparse.Namespace, percentiles):  # type: ignore[no-untyped-def]
    """The result in the time base the flags and target choose, summarized with `percentiles`,
    and the line naming that base."""
    from loadgen.stats import with_percentiles
    from loadgen.timebase import SEEN_KEY, in_time_base, time_base

    base = time_base(wall.meta.get(SEEN_KEY, {}), args.time_scale, args.wall_time)
    result = in_time_base(wall, base)  # SLOs and goodput are judged in the base printed
    if result.meta.get("request_rate") not in (None, float("inf")) and base.scale:
        from loadgen.sweep import SweepRun

        result.meta["request_rate"] *= base.scale  # a sweep's rate, and its name, in the base printed
        result.meta["label"] = SweepRun(result.meta["sweep_kind"], result.meta["request_rate"]).label
    return with_percentiles(result, percentiles), base.note


def _save(result, path: str, fmt: str | None, metrics) -> None:  # type: ignore[no-untyped-def]
    from loadgen.export import write_result

    for written in write_result(result, path, fmt, metrics)[1:]:
        print(f"summary written to {written}", file=sys.stderr)


def _sweep(args: argparse.Namespace, cfg, percentiles, metrics) -> int:  # type: ignore[no-untyped-def]
    import dataclasses

    from loadgen.runner import OpenLoopRunner
    from loadgen.sweep import plot_sweep, run_sweep, sweep_table

    if args.sweep < 0:
        raise ValueError(f"--sweep must be >= 0 constant rates, got {args.sweep}")
    requests = list(_limited(args))
    if not requests:
        raise ValueError("the workload holds no requests to sweep with")

    async def replay(run, reqs):  # type: ignore[no-untyped-def]
        point = dataclasses.replace(cfg, speedup=1.0, duration_s=None, max_requests=None,
                                    concurrency=run.concurrency if run.concurrency else cfg.concurrency,
                                    expected_requests=len(reqs))
        if cfg.show_progress:
            print(f"sweep: {run.label}", file=sys.stderr)
        return await OpenLoopRunner(point).run(reqs)

    walls = _event_loop_runner()(run_sweep(requests, args.sweep, replay))
    reported = [_reported(w, args, percentiles) for w in walls]
    results = [r for r, _ in reported]
    print(reported[0][1])
    print(sweep_table(results))
    if args.output:
        for r in results:
            _save(r, _point_path(args.output, r.label), args.output_format, metrics)
    if args.plot:
        plot_sweep(results, args.plot)
    return 0 if all(r.summary.num_ok for r in results) else 1


def _limited(args: argparse.Namespace) -> Iterator:
    import itertools

    return itertools.islice(_workload(args), args.max_requests)


def _point_path(output: str, label: str) -> str:
    """run.json + constant@2.50 -> run-constant@2.50.json."""
    p = Path(output)
    return str(p.with_name(f"{p.stem}-{label}{p.suffix}"))
