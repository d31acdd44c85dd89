"""`flotilla plan coldstart`: how long a new replica takes to serve, and the backlog meanwhile."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fake_engines.perf.catalogue import load_catalogue
from fake_engines.perf.coldstart import (
    LESSON_SOURCES,
    WeightSource,
    backlog_requests,
    cold_start_s,
    load_s,
)
from fake_engines.perf.rounding import fixed
from flotilla.plan.units import si_json

HELP = "cold start of a new replica (startup + weight load + warm-up) and the requests that pile up"
DESCRIPTION = """\
Cold start = startup + weight size / load rate + warm-up, for each weight source.
The default sources are assumed rates (Hub download at 1 Gb/s, network volume 1 GB/s,
local NVMe 3 GB/s, host page cache 10 GB/s); measure your own and pass --source.
With --arrival-rate and --replica-rate it also prints the backlog: requests arriving
above the ready capacity pile up for the whole cold start.

examples:
  flotilla plan coldstart --weights-gb 16.1 --startup-s 20 --warmup-s 40 --arrival-rate 5 --replica-rate 2 --cold-starts 70,600
  flotilla plan coldstart --model llama-3.1-70b --bits 8 --source "s3 bucket=0.5"
  flotilla plan coldstart --weights-gb 16.1,70.6 --labels "8B BF16,70B FP8" --json"""


def float_list(text: str) -> list[float]:
    """Comma-separated numbers, e.g. 70,600."""
    return [float(x) for x in text.split(",") if x.strip()]


def source(text: str) -> WeightSource:
    """NAME=GBPS, e.g. "local NVMe=3" (GB/s, 1e9 bytes per second)."""
    name, _, rate = text.rpartition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"expected NAME=GBPS, got {text!r}")
    return WeightSource(name, float(rate))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights-gb", "--size-gb", dest="size_gb", type=float_list, metavar="GB,...",
                        help="weights to load in GB, comma-separated for several models (as plan choose spells it; "
                             "--size-gb is the old spelling)")
    parser.add_argument("--labels", type=lambda t: t.split(","), help="model column text, one per size")
    parser.add_argument("--model", help="catalogue model name instead of --weights-gb (with --bits)")
    parser.add_argument("--bits", type=float, default=16, help="bits per weight for --model (default 16)")
    parser.add_argument("--catalogue", action="append", default=[], metavar="FILE",
                        help="extra YAML catalogue adding or overriding models by name (repeatable)")
    parser.add_argument("--startup-s", type=float, default=20.0,
                        help="container and process start before loading, seconds (default 20, an assumption)")
    parser.add_argument("--warmup-s", type=float, default=40.0,
                        help="engine warm-up after loading (CUDA graphs, compilation), seconds (default 40, an assumption)")
    parser.add_argument("--source", action="append", type=source, metavar="NAME=GBPS",
                        help="weight source and its read rate in GB/s (repeatable; default: the four assumed sources)")
    parser.add_argument("--arrival-rate", type=float, help="requests per second arriving after the load step")
    parser.add_argument("--replica-rate", type=float, help="requests per second one replica serves")
    parser.add_argument("--ready-replicas", type=int, default=1, help="replicas already serving (default 1)")
    parser.add_argument("--cold-starts", type=float_list,
                        help="cold starts in seconds to turn into backlogs (default: the shortest and longest above)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    try:
        rows = _rows(args)
        backlogs = _backlogs(args, [r["cold_start_s"] for r in rows])
    except ValueError as exc:
        print(f"flotilla plan coldstart: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(si_json({"rows": rows, "backlogs": backlogs}), indent=2))
        return 0
    _print_rows(rows)
    for b in backlogs:
        print(f"cold start {fixed(b['cold_start_s'], 0):>3} s: {fixed(b['requests'], 0):>5} requests pile up "
              "before new capacity arrives")
    return 0


def _print_rows(rows: list[dict]) -> None:
    # the lesson's column widths, widened when a source or model name is longer
    sw = max([26] + [len(r["source"]) for r in rows])
    mw = max([8] + [len(r["model"]) for r in rows])
    print(f"{'source':<{sw}}  {'model':<{mw}}  {'load s':>7}  {'total cold start s':>18}")
    for r in rows:
        print(f"{r['source']:<{sw}}  {r['model']:<{mw}}  {fixed(r['load_s'], 1):>7}  {fixed(r['cold_start_s'], 1):>18}")


def _models(args: argparse.Namespace) -> list[tuple[str, float]]:
    """(label, weight bytes) for each model to load."""
    if args.size_gb:
        labels = args.labels or [f"{gb:g} GB" for gb in args.size_gb]
        if len(labels) != len(args.size_gb):
            raise ValueError(f"--labels has {len(labels)} entries for {len(args.size_gb)} sizes")
        return [(label, gb * 1e9) for label, gb in zip(labels, args.size_gb, strict=True)]
    if args.model:
        spec = load_catalogue(args.catalogue).model(args.model)
        label = args.labels[0] if args.labels else f"{spec.name} {args.bits:g}-bit"
        return [(label, spec.weight_bytes(args.bits))]
    raise ValueError("give --weights-gb GB or --model NAME")


def _rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    sources = args.source or list(LESSON_SOURCES)
    return [
        {"source": s.name, "model": label, "weight_bytes": size, "load_gbps": s.load_gbps,
         "load_s": load_s(size, s.load_gbps),
         "cold_start_s": cold_start_s(size, s.load_gbps, args.startup_s, args.warmup_s)}
        for label, size in _models(args) for s in sources
    ]


def _backlogs(args: argparse.Namespace, totals: list[float]) -> list[dict[str, float]]:
    if args.arrival_rate is None or args.replica_rate is None:
        return []
    colds = args.cold_starts or sorted({min(totals), max(totals)})
    return [{"cold_start_s": c, "requests": backlog_requests(args.arrival_rate, args.replica_rate, c,
                                                              args.ready_replicas)} for c in colds]
