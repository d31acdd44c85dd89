"""`flotilla plan choose`: how many GPUs a model needs and which split to start from."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from fake_engines.perf.catalogue import load_catalogue
from fake_engines.perf.chooser import Deployment, choose_layout
from fake_engines.perf.rounding import fixed
from flotilla.plan.units import si_json

HELP = "how many GPUs, and which split (TP, PP, replicas, expert parallel) for given weights and GPUs"
DESCRIPTION = """\
A starting layout from the weights and the hardware, by four rules:
keep --kv-reserve (40%) of every GPU for the KV cache and buffers; round the GPU count
up to a power of two so attention heads divide evenly; inside a node use tensor
parallelism over NVLink and pipeline stages over PCIe; across nodes TP inside each node
and PP between nodes. Leftover GPUs become data-parallel replicas. Measure the
candidates under the expected load before deciding.

examples:
  flotilla plan choose --weights-gb 141.2 --gpu-memory-gb 80 --gpus-per-node 8 --nodes 1 --nvlink
  flotilla plan choose --model qwen2.5-32b --bits 4.5 --gpu rtx4090 --gpus-per-node 2
  flotilla plan choose --weights-gb 235 --gpu h100 --moe --json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights-gb", type=float, help="model weights in GB at the serving precision")
    parser.add_argument("--model", help="catalogue model name instead of --weights-gb (with --bits)")
    parser.add_argument("--bits", type=float, default=16, help="bits per weight for --model (default 16)")
    parser.add_argument("--gpu-memory-gb", type=float, help="memory of one GPU in GB")
    parser.add_argument("--gpu", help="catalogue GPU name instead of --gpu-memory-gb (h100, h200, a100, l40s, rtx4090)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs in one server (default 8)")
    parser.add_argument("--nodes", type=int, default=1, help="servers available (default 1)")
    parser.add_argument("--nvlink", action=argparse.BooleanOptionalAction, default=None,
                        help="GPUs of a node are joined by NVLink (default: from --gpu, else PCIe only)")
    parser.add_argument("--moe", action="store_true", help="the model has expert (MoE) layers (default: from --model)")
    parser.add_argument("--kv-reserve", type=float, default=0.4,
                        help="share of each GPU kept for the KV cache and buffers (default 0.4)")
    parser.add_argument("--catalogue", action="append", default=[], metavar="FILE",
                        help="extra YAML catalogue adding or overriding GPUs and models by name (repeatable)")
    parser.add_argument("--label", help="text of the first column (default: weights and hardware)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    try:
        deployment = _deployment(args)
    except ValueError as exc:
        print(f"flotilla plan choose: error: {exc}", file=sys.stderr)
        return 2
    choice = choose_layout(deployment)
    if args.json:
        print(json.dumps(si_json({"deployment": asdict(deployment), "choice": asdict(choice)}), indent=2))
    else:
        print(f"{args.label or _label(deployment):<32} {choice.summary}")
    return 0


def _deployment(args: argparse.Namespace) -> Deployment:
    needs_catalogue = args.model or args.gpu
    cat = load_catalogue(args.catalogue) if needs_catalogue else None
    model = cat.model(args.model) if cat and args.model else None
    gpu = cat.gpu(args.gpu) if cat and args.gpu else None
    weights_gb = args.weights_gb if args.weights_gb is not None else (
        model.weight_bytes(args.bits) / 1e9 if model else None)
    memory_gb = args.gpu_memory_gb if args.gpu_memory_gb is not None else (gpu.memory_gb if gpu else None)
    if weights_gb is None or memory_gb is None:
        raise ValueError("give --weights-gb or --model, and --gpu-memory-gb or --gpu")
    nvlink = args.nvlink if args.nvlink is not None else bool(gpu and gpu.nvlink_gbps > 0)
    moe = args.moe or bool(model and model.is_moe)
    return Deployment(weights_gb, memory_gb, args.gpus_per_node, args.nodes, nvlink, moe, args.kv_reserve)


def _label(d: Deployment) -> str:
    nodes = f"{d.nodes} nodes x " if d.nodes > 1 else ""
    link = "NVLink" if d.nvlink else "PCIe"
    weights = fixed(d.weights_gb, 1).removesuffix(".0")
    return f"{weights} GB, {nodes}{d.gpus_per_node} x {d.gpu_memory_gb:g} GB {link}"
