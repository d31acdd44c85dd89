"""`flotilla plan experts`: expert-parallel work per device, imbalance, placements (Example 8)."""

from __future__ import annotations

import argparse
import json

from fake_engines.perf.experts import (
    Placement,
    all_to_all_bytes,
    balanced_placement,
    contiguous_placement,
    expected_remote_share,
    explicit_placement,
    remote_copies,
    route_tokens,
)
from fake_engines.perf.rounding import fixed
from flotilla.plan.allreduce import float_list
from flotilla.plan.fit import PlanError, fail
from flotilla.plan.units import si_json

HELP = "expert-parallel work per device from expert loads, imbalance, better placements, hot-expert replicas"
DESCRIPTION = """\
Expert parallelism gives each GPU whole experts. Every device waits for the busiest one, so the
imbalance (max work / mean work) is the slowdown of each MoE layer. A better placement spreads
the hot experts; replicas of hot experts (vLLM --enable-eplb, num_redundant_experts) share their
load. Every token copy routed to another GPU crosses twice (dispatch and combine).

examples:
  flotilla plan experts --devices 4 --loads 16,18,4,4,6,4,5,7
  flotilla plan experts --devices 4 --loads 16,18,4,4,6,4,5,7 --redundant 4
  flotilla plan experts --devices 4 --loads 16,18,4,4,6,4,5,7 --placement 0,7/1,6/2,5/3,4 --remote-copies 50
  flotilla plan experts --devices 4 --route-tokens 32 --experts 8 --top-k 2 --placement 0,7/1,6/2,5/3,4"""


def placement_spec(text: str) -> list[list[int]]:
    """Experts per device: comma-separated ids, devices separated by '/', e.g. 0,7/1,6/2,5/3,4."""
    try:
        return [[int(e) for e in dev.split(",") if e.strip()] for dev in text.split("/")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected expert ids like 0,7/1,6, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=int, default=4, help="GPUs sharing the experts (EP size, default 4)")
    parser.add_argument("--loads", type=float_list,
                        help="token copies routed to each expert in one layer, comma-separated, expert 0 first")
    parser.add_argument("--route-tokens", type=int, metavar="N",
                        help="instead of --loads, route N tokens (spread evenly over the devices) to their top-k "
                             "experts with Gaussian scores, as the lesson's program does")
    parser.add_argument("--experts", type=int, default=8, help="with --route-tokens: experts in the layer (default 8)")
    parser.add_argument("--top-k", type=int, default=2, help="with --route-tokens: experts per token (default 2)")
    parser.add_argument("--hot-experts", type=int, default=2,
                        help="with --route-tokens: the first this many experts are popular (default 2)")
    parser.add_argument("--hot-bias", type=float, default=1.0,
                        help="with --route-tokens: extra score of the popular experts (default 1.0)")
    parser.add_argument("--seed", type=int, default=7, help="with --route-tokens: java.util.Random seed (default 7)")
    parser.add_argument("--redundant", type=int, default=0,
                        help="extra expert slots for replicas of the hottest experts (num_redundant_experts, default 0)")
    parser.add_argument("--placement", type=placement_spec,
                        help="a placement to evaluate: experts per device, devices separated by '/', e.g. 0,7/1,6/2,5/3,4")
    parser.add_argument("--hidden", type=int, default=4096, help="hidden size: values each token copy carries (default 4096)")
    parser.add_argument("--dtype-bytes", type=int, default=2, help="bytes per value (default 2, BF16)")
    parser.add_argument("--remote-copies", type=int,
                        help="token copies that leave their GPU (default: (n - 1) / n of all copies, uniform routing)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the text")


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else fixed(v, 1)


def _list(values: list[float]) -> str:
    return "[" + ", ".join(_number(v) for v in values) + "]"


def _sets(p: Placement) -> str:
    return " ".join("{" + ",".join(map(str, held)) + "}" for held in p.experts)


def _placements(args: argparse.Namespace) -> dict[str, Placement]:
    if args.devices < 1 or any(x < 0 for x in args.loads):
        raise PlanError("--devices must be positive and --loads not negative")
    out = {"contiguous": contiguous_placement(args.loads, args.devices),
           "better": balanced_placement(args.loads, args.devices)}
    if args.redundant:
        out["replicated"] = balanced_placement(args.loads, args.devices, args.redundant)
    if args.placement:
        if len(args.placement) != args.devices or any(not 0 <= e < len(args.loads) for h in args.placement for e in h):
            raise PlanError(f"--placement needs {args.devices} devices of expert ids below {len(args.loads)}")
        out["given"] = explicit_placement(args.placement, args.loads)
    return out


def _remote(args: argparse.Namespace) -> tuple[float, float]:
    total = sum(args.loads)
    if args.remote_copies is not None:
        return float(args.remote_copies), total
    return total * expected_remote_share(args.devices), total


def _route(args: argparse.Namespace) -> list[list[int]] | None:
    """Route tokens when asked: fills args.loads and args.remote_copies, returns the copy matrix."""
    if args.route_tokens is None:
        if args.loads is None:
            raise PlanError("give --loads or --route-tokens")
        return None
    if args.experts % args.devices or args.route_tokens % args.devices or not 0 < args.top_k <= args.experts:
        raise PlanError("--experts and --route-tokens must divide over --devices, and 0 < --top-k <= --experts")
    routing = route_tokens(args.route_tokens, args.devices, args.experts, args.top_k, args.hot_experts,
                           args.hot_bias, args.seed)
    args.loads = [float(x) for x in routing.expert_loads]
    if args.remote_copies is None:
        args.remote_copies = remote_copies(routing.copies)
    return routing.copies


def _matrix(copies: list[list[int]]) -> list[str]:
    lines = ["token copies   to " + "  ".join(f"dev{d}" for d in range(len(copies)))]
    return lines + [f"from device {s}" + "".join(f"  {n:4d}" for n in row) for s, row in enumerate(copies)]


def run(args: argparse.Namespace) -> int:
    try:
        copies = _route(args)
        placements = _placements(args)
    except (PlanError, ValueError) as exc:
        return fail("experts", exc)
    remote, total = _remote(args)
    kib = all_to_all_bytes(remote, args.hidden, args.dtype_bytes) / 1024
    if args.json:
        doc = {name: {"experts": p.experts, "work": p.work, "max": p.max_work, "mean": p.mean_work,
                      "imbalance": p.imbalance} for name, p in placements.items()}
        print(json.dumps(si_json({"placements": doc, "remote_copies": remote, "copies": total, "copy_matrix": copies,
                          "expert_loads": args.loads, "all_to_all_bytes_per_layer": kib * 1024}), indent=2))
        return 0
    for line in _matrix(copies) if copies else []:
        print(line)
    print("tokens per expert: " + _list(args.loads))
    c = placements["contiguous"]
    print(f"work per device: {_list(c.work)}, max {_number(c.max_work)} vs mean {fixed(c.mean_work, 0)} "
          f"(imbalance {fixed(c.imbalance, 2)})")
    for name in ("given", "better", "replicated"):
        if name in placements:
            p = placements[name]
            title = {"given": "placement", "better": "better placement",
                     "replicated": f"with {args.redundant} replica slot(s)"}[name]
            print(f"{title} {_sets(p)}: work per device {_list(p.work)}, max {_number(p.max_work)} "
                  f"(imbalance {fixed(p.imbalance, 2)})")
    dtype = {2: "BF16", 1: "FP8", 4: "FP32"}.get(args.dtype_bytes, f"{8 * args.dtype_bytes}-bit")
    source = "" if args.remote_copies is not None else " (uniform routing)"
    print(f"remote copies {_number(remote)} of {_number(total)}{source}; bytes per layer "
          f"(dispatch + combine, {dtype}): {_number(kib)} KiB")
    return 0
