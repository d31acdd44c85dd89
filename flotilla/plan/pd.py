"""`flotilla plan pd`: colocated against the best prefill:decode splits of a GPU budget."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from flotilla.plan.units import si_json

HELP = "colocated vs disaggregated prefill/decode: the best prefill:decode ratios for a GPU budget"
DESCRIPTION = """\
Predicted goodput (requests per second within both SLOs) of a colocated fleet and of every
prefill:decode split of the same GPUs, from the capacity model: prefill throughput per replica
at the TTFT SLO (queueing included), decode throughput at the largest batch the TPOT SLO and the
KV cache allow, the KV transfer over --link (fake_engines/pd_capacity.py, docs/pd.md). Then the
simulator checks the colocated fleet and the best --check splits on identical Poisson arrivals at
the best predicted goodput (--check 0: no check).

example:
  flotilla plan pd --model llama-3.1-8b --gpu h100 --gpus 8 --link ib400 \\
      --input-len 4096 --output-len 256 --ttft-slo 1 --tpot-slo 0.05"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from fake_engines.perf.kv_transfer import DEFAULT_KV_LINK, KV_LINKS

    parser.add_argument("--model", required=True, help="catalogue model, e.g. llama-3.1-8b")
    parser.add_argument("--gpu", required=True, help="catalogue GPU, e.g. h100")
    parser.add_argument("-tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                        help="GPUs per replica (default 1)")
    parser.add_argument("--gpus", type=int, required=True, metavar="BUDGET", help="GPUs of the whole fleet")
    parser.add_argument("--link", default=DEFAULT_KV_LINK, choices=KV_LINKS,
                        help=f"link the KV cache crosses from prefill to decode (default {DEFAULT_KV_LINK})")
    parser.add_argument("--input-len", type=int, default=1024, help="prompt tokens per request (default 1024)")
    parser.add_argument("--output-len", type=int, default=256, help="output tokens per request (default 256)")
    parser.add_argument("--ttft-slo", type=float, default=1.0, metavar="S", help="TTFT SLO, seconds (default 1)")
    parser.add_argument("--tpot-slo", type=float, default=0.05, metavar="S", help="TPOT SLO, seconds (default 0.05)")
    parser.add_argument("--top", type=int, default=5, help="splits listed (default 5)")
    parser.add_argument("--check", type=int, default=3, metavar="K",
                        help="simulate the colocated fleet and the best K splits (default 3; 0: no check)")
    parser.add_argument("--check-requests", type=int, default=300, metavar="N",
                        help="requests of the simulator's check (default 300)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    from fake_engines.factory import build_engine
    from fake_engines.factory.catalogue import catalogue_of
    from fake_engines.pd_capacity import RequestShape, replica_rates, splits
    from fake_engines.perf.batch import Layout
    from sim.build import EngineSpec

    if args.gpus < 2 * args.tp or args.gpus % args.tp:
        raise ValueError(f"--gpus must be a multiple of -tp ({args.tp}) with room for two replicas")
    for name in ("input_len", "output_len", "ttft_slo", "tpot_slo"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    spec = EngineSpec(model=args.model, gpu=args.gpu, layout=Layout(tp=args.tp))
    engine = build_engine(spec.group().engine_config())
    shape = RequestShape(args.input_len, args.output_len, args.ttft_slo, args.tpot_slo)
    rates = replica_rates(engine, catalogue_of(()).link(args.link), shape)
    replicas = args.gpus // args.tp
    return {"spec": spec, "shape": shape, "rates": rates, "replicas": replicas,
            "colocated_rps": replicas * rates.colocated_rps, "splits": splits(rates, replicas)}


def run(args: argparse.Namespace) -> int:
    from fake_engines.factory import ModelDoesNotFit

    try:
        plan = _plan(args)
        checked = _check(args, plan) if args.check > 0 else []
    except (ValueError, KeyError, ModelDoesNotFit) as exc:
        print(f"flotilla plan pd: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(si_json(_json(args, plan, checked)), indent=1))
    else:
        print(_table(args, plan))
        if checked:
            print(_check_table(args, plan, checked))
    return 0


def _check(args: argparse.Namespace, plan: dict[str, Any]) -> list:  # type: ignore[type-arg]
    from loadgen.results import Slo
    from sim.pd import check_splits

    best = _rate(plan)
    if best <= 0:
        return []
    chosen = [(s.prefill, s.decode) for s in plan["splits"][: args.check]]
    return check_splits(plan["spec"], chosen, plan["replicas"], args.link, best, args.input_len, args.output_len,
                        Slo(ttft_s=args.ttft_slo, tpot_s=args.tpot_slo), args.check_requests)


def _label(split: Any) -> str:
    return f"P/D {split.prefill}:{split.decode}"


def _table(args: argparse.Namespace, plan: dict[str, Any]) -> str:
    r, n = plan["rates"], plan["replicas"]
    lines = [
        f"{args.model} on {args.gpu}, tp {args.tp}: {args.gpus} GPUs = {n} replicas; requests {args.input_len} in / "
        f"{args.output_len} out; SLOs TTFT {args.ttft_slo:g} s, TPOT {1e3 * args.tpot_slo:g} ms; KV link {args.link}",
        f"per replica: prefill {r.prefill_s:.3f} s a step of {r.prefill_batch} prompt(s) -> {r.prefill_rps:.2f} req/s "
        f"within the TTFT SLO; KV pull {1e3 * r.transfer_s:.2f} ms; decode batch {r.decode_batch} at "
        f"{1e3 * r.decode_step_s:.1f} ms a step -> {r.decode_rps:.2f} req/s; colocated {r.colocated_rps:.2f} req/s",
        "",
        f"{'fleet':<14} {'goodput/s':>10} {'per GPU':>8}  bound",
        f"{'colocated x' + str(n):<14} {plan['colocated_rps']:>10.2f} {plan['colocated_rps'] / args.gpus:>8.3f}  -",
    ]
    for s in plan["splits"][: args.top]:
        lines.append(f"{_label(s):<14} {s.goodput_rps:>10.2f} {s.goodput_rps / args.gpus:>8.3f}  {s.bound}")
    best = plan["splits"][0]
    verdict = "disaggregate" if best.goodput_rps > plan["colocated_rps"] else "stay colocated"
    lines.append(f"best prefill:decode ratio {best.prefill}:{best.decode}; predicted: {verdict}")
    return "\n".join(lines)


def _check_table(args: argparse.Namespace, plan: dict[str, Any], checked: list) -> str:  # type: ignore[type-arg]
    predicted = {f"colocated x{plan['replicas']}": plan["colocated_rps"],
                 **{f"{_label(s)} {args.link}": s.goodput_rps for s in plan["splits"]}}
    rate = _rate(plan)
    lines = ["", f"checked by the simulator ({args.check_requests} requests, Poisson at {rate:.2f} req/s, identical "
                 "arrivals):", f"{'fleet':<22} {'predicted':>9} {'simulated':>9} {'SLO met':>7} {'TTFT p90':>9} "
                 f"{'TPOT p90':>9}"]
    for r in checked:
        s = r.summary
        lines.append(f"{r.label:<22} {predicted.get(r.label, 0.0):>9.2f} {_simulated(r, rate):>9.2f} "
                     f"{100 * (s.slo_attainment or 0.0):>6.1f}% {1e3 * (s.ttft_s.p90 or 0.0):>7.1f}ms "
                     f"{1e3 * (s.tpot_s.p90 or 0.0):>7.1f}ms")
    pd_runs = [r for r in checked if "pd" in r.meta]
    if pd_runs:
        sim_best = max(pd_runs, key=lambda r: (_simulated(r, rate), -(r.summary.ttft_s.p90 or 0.0))).label
        plan_best = f"{_label(plan['splits'][0])} {args.link}"
        agree = "agree" if sim_best == plan_best else "disagree"
        lines.append(f"best split: plan {plan_best}, simulator {sim_best} ({agree})")
    return "\n".join(lines)


def _simulated(result: Any, rate: float) -> float:
    """Simulated goodput: the offered rate times the share of requests within both SLOs (a short
    run's drain would otherwise weigh on a rate over its whole span)."""
    return rate * (result.summary.slo_attainment or 0.0)


def _json(args: argparse.Namespace, plan: dict[str, Any], checked: list) -> dict[str, Any]:  # type: ignore[type-arg]
    return {"model": args.model, "gpu": args.gpu, "tp": args.tp, "gpus": args.gpus, "link": args.link,
            "shape": asdict(plan["shape"]), "replica": asdict(plan["rates"]), "colocated_rps": plan["colocated_rps"],
            "splits": [asdict(s) for s in plan["splits"]],
            "checked": [{"label": r.label, "goodput_rps": _simulated(r, _rate(plan)),
                         "slo_attainment": r.summary.slo_attainment} for r in checked]}


def _rate(plan: dict[str, Any]) -> float:
    """The check's offered rate: the best predicted goodput."""
    return max([plan["colocated_rps"], *(s.goodput_rps for s in plan["splits"][:1])])
