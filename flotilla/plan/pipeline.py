"""`flotilla plan pipeline`: the pipeline bubble and batches in flight (Examples 6 and 7)."""

from __future__ import annotations

import argparse
import json

from fake_engines.perf.pipeline import Timeline, batches_in_flight, busy_share, timeline
from fake_engines.perf.rounding import fixed
from flotilla.plan.allreduce import int_list
from flotilla.plan.fit import PlanError, fail
from flotilla.plan.units import si_json

HELP = "pipeline-parallel busy share m / (m + p - 1), timelines, and batches in flight"
DESCRIPTION = """\
Pipeline parallelism cuts the model between layers into p stages. One batch cut into m
micro-batches keeps the stages busy m / (m + p - 1) of the time; decoding needs p independent
batches in flight to keep every stage busy, and no sequence gets its tokens faster.

examples:
  flotilla plan pipeline --stages 2,4,8 --micro-batches 1,2,4,8,16,32
  flotilla plan pipeline --timeline                 # 4 stages with 1 and with 4 micro-batches
  flotilla plan pipeline --timeline 8x16 --json"""


def timeline_spec(text: str) -> list[tuple[int, int]]:
    """STAGESxMICRO_BATCHES, comma-separated, e.g. 4x1,4x4."""
    try:
        pairs = [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STAGESxMICRO_BATCHES like 4x4, got {text!r}") from None
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected STAGESxMICRO_BATCHES like 4x4, got {text!r}")
    return [(stages, micro) for stages, micro in pairs]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", type=int_list, default=[2, 4, 8],
                        help="pipeline stages p (GPUs in the pipeline), comma-separated (default 2,4,8)")
    parser.add_argument("--micro-batches", type=int_list, default=[1, 2, 4, 8, 16, 32],
                        help="micro-batches m one batch is cut into, comma-separated (default 1,2,4,8,16,32)")
    parser.add_argument("--decode-stages", type=int, default=4,
                        help="stages for the steady-decoding part (default 4)")
    parser.add_argument("--seqs-per-batch", type=int, default=8,
                        help="sequences in each decoding batch (default 8)")
    parser.add_argument("--window-slots", type=int, default=100,
                        help="time slots counted once the pipeline has filled (default 100)")
    parser.add_argument("--timeline", type=timeline_spec, nargs="?", const=[(4, 1), (4, 4)], metavar="PxM,...",
                        help="draw which micro-batch each stage works on per time slot instead of the table "
                             "(default 4x1,4x4)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the text")


def _check(args: argparse.Namespace) -> None:
    for flag, values in (("--stages", args.stages), ("--micro-batches", args.micro_batches),
                         ("--decode-stages", [args.decode_stages]), ("--seqs-per-batch", [args.seqs_per_batch]),
                         ("--window-slots", [args.window_slots])):
        if not values or min(values) < 1:
            raise PlanError(f"{flag} needs positive numbers")


def run(args: argparse.Namespace) -> int:
    try:
        _check(args)
    except PlanError as exc:
        return fail("pipeline", exc)
    if args.timeline:
        lines = [timeline(p, m) for p, m in args.timeline]
        if args.json:
            print(json.dumps(si_json([{"stages": t.stages, "micro_batches": t.micro_batches, "cells": t.cells,
                                       "busy": t.busy, "slots": t.slots, "busy_share": t.busy_share}
                                      for t in lines])))
            return 0
        for t in lines:
            _print_timeline(t)
        return 0
    if args.json:
        print(json.dumps(si_json(_as_json(args)), indent=2))
        return 0
    _print_table(args)
    _print_in_flight(args)
    return 0


def _print_timeline(t: Timeline) -> None:
    print(f"{t.stages} stages, {t.micro_batches} micro-batch(es), {t.slots} time slots")
    for s, row in enumerate(t.cells):
        print(f"  GPU {s} |" + "".join(f" m{c}" if c is not None else "  ." for c in row))
    total = t.stages * t.slots
    print(f"  busy {t.busy} of {total} stage-slots ({fixed(100 * t.busy_share, 1)}%)")


def _print_table(args: argparse.Namespace) -> None:
    print("busy share m / (m + p - 1) for one batch split into m micro-batches")
    print("stages p" + "".join(f"  {'m=' + str(m):>6}" for m in args.micro_batches))
    for p in args.stages:
        print(f"{p:8d} " + "".join(f"  {fixed(100 * busy_share(m, p), 1):>5}%" for m in args.micro_batches))


def _print_in_flight(args: argparse.Namespace) -> None:
    p = args.decode_stages
    print(f"steady decoding on {p} stages, k batches in flight, {args.seqs_per_batch} sequences per batch, "
          "1 slot per stage")
    for k in range(1, p + 1):
        r = batches_in_flight(p, k, args.seqs_per_batch, window_slots=args.window_slots)
        print(f"  k={k}: GPUs busy {fixed(100 * r.busy_share, 0):>3}%, {r.tokens:3d} tokens per "
              f"{args.window_slots} slots, each sequence gets a token every {r.token_interval_slots} slots")


def _as_json(args: argparse.Namespace) -> dict:
    p = args.decode_stages
    return {
        "busy_share": {str(s): {str(m): busy_share(m, s) for m in args.micro_batches} for s in args.stages},
        "in_flight": [vars(batches_in_flight(p, k, args.seqs_per_batch, window_slots=args.window_slots))
                      for k in range(1, p + 1)],
    }
