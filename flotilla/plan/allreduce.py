"""`flotilla plan allreduce`: tensor-parallel all-reduce traffic and time per forward pass (Example 5)."""

from __future__ import annotations

import argparse
import json

from fake_engines.perf.allreduce import PassTraffic, pass_traffic, ring_steps
from fake_engines.perf.catalogue import CatalogueError, LinkSpec
from fake_engines.perf.memory import matmul_time_s, weight_read_s
from fake_engines.perf.rounding import fixed
from flotilla.plan.fit import PlanError, add_catalogue_argument, catalogue, fail
from flotilla.plan.units import si_json

HELP = "all-reduce traffic per GPU and its time on each link for decode and prefill passes"
DESCRIPTION = """\
Tensor parallelism does two all-reduces per layer (after attention and after the MLP), each of
tokens x hidden values. A ring all-reduce sends 2 (n - 1) / n of the tensor per GPU and takes
2 (n - 1) steps one after another; each step pays a fixed latency.

examples:
  flotilla plan allreduce --hidden 8192 --layers 80 --tp 8 --tokens 1,64,4096 --params 70.6e9
  flotilla plan allreduce --model llama-3.1-8b --tp 2 --links nvlink,pcie5,eth100"""

LINK_TITLES = {"nvlink": "NVLink", "pcie4": "PCIe 4.0", "pcie5": "PCIe 5.0", "ib400": "IB 400G",
               "eth100": "Eth 100G"}


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="NAME", help="catalogue model giving --hidden, --layers and --params")
    parser.add_argument("--hidden", type=int, help="hidden size: values per token in each all-reduce")
    parser.add_argument("--layers", type=int, help="transformer layers (two all-reduces each)")
    parser.add_argument("--params", type=float, help="parameters, for the weight-read and prefill references")
    parser.add_argument("-tp", "--tensor-parallel-size", "--tp", dest="tp", type=int, default=8,
                        help="tensor-parallel size: GPUs in the ring (default 8; --tp is the old spelling)")
    parser.add_argument("--tokens", type=int_list, default=[1, 64, 4096],
                        help="tokens per forward pass, comma-separated (default 1,64,4096)")
    parser.add_argument("--prefill-from", type=int, default=512,
                        help="passes of at least this many tokens are labelled prefills, smaller ones "
                             "decode steps of that batch (default 512)")
    parser.add_argument("--links", default="nvlink,pcie4",
                        help="catalogue links to time the traffic on, comma-separated (default nvlink,pcie4)")
    parser.add_argument("--latency-us", type=float_list, default=[1.0, 5.0],
                        help="assumed start-up delay of one ring step, microseconds, comma-separated (default 1,5)")
    parser.add_argument("--bandwidth-tbs", type=float, default=3.35,
                        help="GPU memory bandwidth for the decode reference, TB/s (default 3.35, H100 SXM)")
    parser.add_argument("--tflops", type=float, default=989,
                        help="GPU dense BF16 rate for the prefill reference, TFLOP/s (default 989, H100 SXM)")
    parser.add_argument("--dtype-bytes", type=int, default=2, help="bytes per activation value (default 2, BF16)")
    add_catalogue_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def _shape(args: argparse.Namespace) -> tuple[int, int, float | None]:
    hidden, layers, params = args.hidden, args.layers, args.params
    if args.model:
        m = catalogue(args).model(args.model)
        hidden, layers, params = hidden or m.hidden, layers or m.layers, params or m.params
    if not hidden or not layers:
        raise PlanError("give --hidden and --layers, or --model NAME")
    if args.tp < 2:
        raise PlanError(f"--tp must be at least 2 for an all-reduce, got {args.tp}")
    return hidden, layers, params


def _label(tokens: int, prefill_from: int) -> str:
    return f"prefill, {tokens} tokens" if tokens >= prefill_from else f"decode, batch {tokens}"


def run(args: argparse.Namespace) -> int:
    try:
        hidden, layers, params = _shape(args)
        links = [catalogue(args).link(name) for name in args.links.split(",")]
    except (PlanError, CatalogueError) as exc:
        return fail("allreduce", exc)
    passes = [pass_traffic(t, hidden, layers, args.tp, args.dtype_bytes) for t in args.tokens]
    if args.json:
        print(json.dumps(si_json(_as_json(args, passes, links, params)), indent=2))
        return 0
    _print_table(args, passes, links)
    _print_latency(args, passes[0])
    if params:
        _print_references(args, params)
    return 0


def _print_table(args: argparse.Namespace, passes: list[PassTraffic], links: list[LinkSpec]) -> None:
    titles = [f"{LINK_TITLES.get(link.name, link.name)} ms" for link in links]
    width = max([20] + [len(_label(p.tokens, args.prefill_from)) for p in passes])
    print(f"{'forward pass':<{width}}  MB per all-reduce  MB sent per GPU  " + "  ".join(titles))
    for p in passes:
        times = [fixed(p.bandwidth_s(link) * 1e3, 2).rjust(max(9, len(t))) for link, t in zip(links, titles, strict=True)]
        print(f"{_label(p.tokens, args.prefill_from):<{width}}  {fixed(p.allreduce_bytes / 1e6, 3):>17}  "
              f"{fixed(p.bytes_per_gpu / 1e6, 1):>15}  " + "  ".join(times))


def _print_latency(args: argparse.Namespace, p: PassTraffic) -> None:
    per = ring_steps(args.tp)
    print(f"ring steps one after another per pass: {p.allreduces} all-reduces x {per} steps = {p.sequential_steps}")
    for us in args.latency_us:
        print(f"  at an assumed {us:g} us per step: {fixed(p.latency_s(us * 1e-6) * 1e3, 2)} ms per pass")


def _params_text(params: float) -> str:
    return f"{params / 1e9:g}e9"


def _print_references(args: argparse.Namespace, params: float) -> None:
    weights = params * args.dtype_bytes / args.tp
    read_ms = weight_read_s(weights, args.bandwidth_tbs * 1e12) * 1e3
    print(f"decode reference: reading {fixed(weights / 1e9, 2)} GB of weights per GPU at {args.bandwidth_tbs:g} TB/s "
          f"takes {fixed(read_ms, 2)} ms")
    tokens = max(args.tokens)
    prefill_ms = matmul_time_s(params, tokens, args.tflops * 1e12, args.tp) * 1e3
    print(f"prefill reference: 2 x {_params_text(params)} x {tokens} FLOPs over {args.tp} GPUs at "
          f"{args.tflops:g} TFLOP/s takes {fixed(prefill_ms, 1)} ms")


def _as_json(args: argparse.Namespace, passes: list[PassTraffic], links: list[LinkSpec],
             params: float | None) -> dict:
    rows = [{"label": _label(p.tokens, args.prefill_from), "tokens": p.tokens,
             "allreduce_bytes": p.allreduce_bytes, "bytes_per_gpu": p.bytes_per_gpu,
             "bandwidth_s": {link.name: p.bandwidth_s(link) for link in links}} for p in passes]
    first = passes[0]
    doc: dict = {"tp": args.tp, "passes": rows, "allreduces": first.allreduces,
                 "sequential_steps": first.sequential_steps,
                 "latency_s": {f"{us:g}us": first.latency_s(us * 1e-6) for us in args.latency_us}}
    if params:
        weights = params * args.dtype_bytes / args.tp
        doc["decode_reference"] = {"weight_bytes_per_gpu": weights,
                                   "read_s": weight_read_s(weights, args.bandwidth_tbs * 1e12)}
        doc["prefill_reference"] = {"tokens": max(args.tokens),
                                    "compute_s": matmul_time_s(params, max(args.tokens), args.tflops * 1e12, args.tp)}
    return doc
