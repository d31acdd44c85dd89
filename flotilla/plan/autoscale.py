"""`flotilla plan autoscale`: the fluid what-if of Example 18 under any scaling policy."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from decimal import ROUND_HALF_UP, Decimal

from flotilla.plan.units import si_json
from policies.scaling import registry
from policies.scaling.base import ConfigError
from policies.scaling.fluid import FluidRun, FluidScenario, RateProfile, simulate

HELP = "replay a traffic profile through a scaling policy with cold starts (fluid model)"
DESCRIPTION = (
    "A fluid what-if: requests as fractions per second, one decision per policy interval, new\n"
    "replicas ready after the cold start. Prints ready, starting and waiting every report period\n"
    "and the peak queue. --capacity, and --target/--interval/--drain-s when given, fill the\n"
    "policy's settings of the same meaning unless --policy sets them.\n\n"
    "example (the seed lesson's Example 18):\n"
    "  flotilla plan autoscale --capacity 2 --target 0.8 --interval 30 --drain-s 60 \\\n"
    "      --cold-start 70,190 --rate 0:2,120:2,240:8,600:8 --duration 600"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--capacity", type=float, default=2.0, help="requests per second one replica serves")
    # None: leave the policy's own default (KPA's 2 s tick is not seed's 30 s interval)
    parser.add_argument("--target", type=float, help="target utilisation of a replica (0, 1]; seed: 0.8")
    parser.add_argument("--interval", type=float, help="seconds between decisions; seed: 30")
    parser.add_argument("--drain-s", type=float, help="seconds to work off the waiting requests; seed: 60")
    parser.add_argument("--cold-start", default="70", help="cold start seconds; a comma list runs one table each")
    parser.add_argument("--rate", default="0:2,120:2,240:8,600:8",
                        help="piecewise-linear arrival rate as time_s:rps points")
    parser.add_argument("--duration", type=int, default=600, help="seconds to simulate")
    parser.add_argument("--initial-replicas", type=int, default=1, help="replicas ready at t=0")
    parser.add_argument("--report-every", type=int, default=60, help="seconds between table rows")
    parser.add_argument("--policy", default="seed",
                        help=f"scaling policy spec NAME[:key=value,...]; one of {', '.join(registry.available_policies())}")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    try:
        runs = _simulate_all(args)
    except (ConfigError, registry.UnknownPolicyError) as exc:
        print(f"flotilla plan autoscale: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(si_json({"runs": [asdict(r) for r in runs]}), indent=2))
    else:
        for r in runs:
            print(format_run(r))
    return 0


def _simulate_all(args: argparse.Namespace) -> list[FluidRun]:
    given = {"capacity_rps": args.capacity, "target_utilization": args.target,
             "interval_s": args.interval, "drain_s": args.drain_s}
    defaults = {k: v for k, v in given.items() if v is not None}
    rate = RateProfile.parse(args.rate)
    runs = []
    for cold_start_s in _cold_starts(args.cold_start):
        policy = registry.create_policy(args.policy, defaults)  # fresh per run: policies remember history
        scenario = FluidScenario(args.capacity, cold_start_s, args.duration, args.initial_replicas,
                                 args.report_every)
        runs.append(simulate(policy, rate, scenario))
    return runs


def _cold_starts(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError("cold_start", text, "expected seconds, e.g. 70,190") from None


def half_up(value: float, places: int) -> str:
    """Round as the lesson's printf does (half away from zero on the shortest decimal form)."""
    if value == float("inf"):
        return "inf"
    quantum = Decimal(1).scaleb(-places)
    return str(Decimal(repr(value)).quantize(quantum, rounding=ROUND_HALF_UP))


def format_run(run: FluidRun) -> str:
    """Example 18's table for one run."""
    lines = [f"cold start {run.cold_start_s:g} s"]
    for row in run.rows:
        lines.append(f"  t={row.t_s:3d} s  rate {half_up(row.rate_rps, 1)}/s  ready {row.ready}"
                     f"  starting {row.starting}  waiting {half_up(row.waiting, 0):>4}")
    lines.append(f"  peak waiting {half_up(run.peak_waiting, 0)} requests,"
                 f" peak queueing delay {half_up(run.peak_queueing_delay_s, 0)} s")
    return "\n".join(lines)
