"""`flotilla plan vllm-layout`: GPUs, engines and expert grouping of vLLM's parallel flags."""

from __future__ import annotations

import argparse
import json
import sys

from fake_engines.perf.catalogue import load_catalogue
from fake_engines.perf.layout_vllm import VllmLayout
from flotilla.plan.units import si_json

HELP = "what vLLM's -tp -pp -dp --enable-expert-parallel add up to: GPUs, engines, expert layers"
DESCRIPTION = """\
Counts what a combination of vLLM's parallelism flags means.

One engine (one scheduler) uses pp x tp GPUs; the deployment uses that times dp.
MoE layers treat tp x dp GPUs as one group: without --enable-expert-parallel every
expert is split that many ways; with it, whole experts are spread over the group.
Dense models run dp independent engines.

examples:
  flotilla plan vllm-layout -tp 8
  flotilla plan vllm-layout -tp 4 -pp 2
  flotilla plan vllm-layout -tp 2 -dp 4 --enable-expert-parallel --moe
  flotilla plan vllm-layout --model qwen3-30b-a3b -dp 8 --enable-expert-parallel --json"""

COLUMNS = "flags                                 GPUs  engines  per engine  expert layers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                        help="GPUs that split every layer of one pipeline stage (default 1)")
    parser.add_argument("-pp", "--pipeline-parallel-size", dest="pp", type=int, default=1,
                        help="pipeline stages of one engine (default 1)")
    parser.add_argument("-dp", "--data-parallel-size", dest="dp", type=int, default=1,
                        help="engines, each with its own scheduler (default 1)")
    parser.add_argument("-ep", "--enable-expert-parallel", dest="ep", action="store_true",
                        help="MoE layers hold whole experts per GPU instead of a slice of every expert")
    parser.add_argument("--moe", action="store_true", help="the model has expert (MoE) layers (default: dense)")
    parser.add_argument("--model", help="catalogue model name; decides dense or MoE")
    parser.add_argument("--catalogue", action="append", default=[], metavar="FILE",
                        help="extra YAML catalogue adding or overriding models by name (repeatable)")
    parser.add_argument("--label", help="text of the model column (default: MoE, dense or the model name)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    try:
        moe = args.moe or (args.model is not None and load_catalogue(args.catalogue).model(args.model).is_moe)
        layout = VllmLayout(tp=args.tp, pp=args.pp, dp=args.dp, enable_expert_parallel=args.ep, moe=moe)
    except ValueError as exc:
        print(f"flotilla plan vllm-layout: error: {exc}", file=sys.stderr)
        return 2
    label = args.label or args.model or ("MoE" if moe else "dense")
    if args.json:
        print(json.dumps(si_json(_as_json(layout, label)), indent=2))
        return 0
    width = max(9, len(label))  # the lesson's column width; a long model name widens it
    print(f"{'model':<{width}}  {COLUMNS}")
    print(f"{label:<{width}}  {layout.flags():<36}  {layout.gpus:4d}  {layout.engines:7d}  "
          f"{layout.world_size:10d}  {layout.expert_layers()}")
    return 0


def _as_json(layout: VllmLayout, label: str) -> dict[str, object]:
    return {
        "model": label, "moe": layout.moe, "tp": layout.tp, "pp": layout.pp, "dp": layout.dp,
        "enable_expert_parallel": layout.enable_expert_parallel, "flags": layout.flags(),
        "gpus": layout.gpus, "engines": layout.engines, "gpus_per_engine": layout.world_size,
        "moe_group_gpus": layout.moe_group, "expert_parallel": layout.expert_parallel,
        "expert_layers": layout.expert_layers(),
    }
