"""`flotilla plan llamacpp-split`: which GPU holds which layers under llama.cpp's -sm layer."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict

from fake_engines.perf.catalogue import load_catalogue
from fake_engines.perf.layout_llamacpp import (
    LlamaCppSplit,
    assign_layers,
    assign_layers_single_gpu,
    resolve_proportions,
)
from flotilla.plan.units import si_json

HELP = "layers per GPU for llama.cpp's layer split from -ngl and -ts (or free memory)"
DESCRIPTION = """\
Where llama.cpp (llama-server, llama-cli) puts each layer with --split-mode layer.

The proportions (-ts, or each GPU's free memory when -ts is absent or all zero) become
running sums normalized to 1; the output layer counts as one more layer; only the last
-ngl layers go to GPUs and the first ones stay on the CPU. Same float32 arithmetic as
llama_model_base::load_tensors, so boundary layers land where the real engine puts them.

examples:
  flotilla plan llamacpp-split --layers 32 -ngl 99 -ts 3,1
  flotilla plan llamacpp-split --layers 32 -ngl 99 --free-gb 22,10
  flotilla plan llamacpp-split --layers 32 -ngl 99 -sm none -mg 1 -ts 1,1
  flotilla plan llamacpp-split --model llama-3.1-70b -ngl 60 -ts 1,1 --json"""


def number_list(text: str) -> list[float]:
    """Comma- or slash-separated numbers, as llama.cpp parses -ts."""
    return [float(x) for x in re.split(r"[,/]+", text.strip()) if x]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, help="repeating (transformer) layers of the model, n_layer")
    parser.add_argument("--model", help="catalogue model name instead of --layers (e.g. llama-3.1-8b)")
    parser.add_argument("--catalogue", action="append", default=[], metavar="FILE",
                        help="extra YAML catalogue adding or overriding models by name (repeatable)")
    parser.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="ngl", type=int, default=-1, metavar="N",
                        help="layers to offload to the GPUs, counting the output layer; "
                             "the last ones go first (default: -1 = all)")
    parser.add_argument("-ts", "--tensor-split", dest="ts", type=number_list, metavar="N0,N1,...",
                        help="proportion of the model for each GPU, e.g. 3,1 (one entry per GPU)")
    parser.add_argument("--free-gb", type=number_list, metavar="GB0,GB1,...",
                        help="free memory of each GPU at load time in GB: the split when -ts is absent or all zero")
    parser.add_argument("-sm", "--split-mode", choices=("layer", "none"), default="layer",
                        help="layer (default): layers spread over the GPUs; none: only the --main-gpu")
    parser.add_argument("-mg", "--main-gpu", type=int, default=0, metavar="INDEX",
                        help="the GPU that holds the model with --split-mode none (default 0)")
    parser.add_argument("--label", help="text before the colon (default: the flags)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    try:
        n_layer = _n_layer(args)
        split = _split(n_layer, args)
    except ValueError as exc:
        print(f"flotilla plan llamacpp-split: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(si_json(_as_json(split, args)), indent=2))
    else:
        _print_table(split, args)
    return 0


def _n_layer(args: argparse.Namespace) -> int:
    if args.layers is not None:
        return args.layers
    if args.model:
        return load_catalogue(args.catalogue).model(args.model).layers
    raise ValueError("give --layers N or --model NAME")


def _split(n_layer: int, args: argparse.Namespace) -> LlamaCppSplit:
    if args.split_mode == "none":
        gpus = len(args.ts or args.free_gb or []) or args.main_gpu + 1
        return assign_layers_single_gpu(n_layer, args.ngl, args.main_gpu, gpus)
    free = [gb * 1e9 for gb in args.free_gb] if args.free_gb else None
    return assign_layers(n_layer, args.ngl, resolve_proportions(args.ts, free))


def _label(args: argparse.Namespace) -> str:
    if args.label is not None:
        return args.label
    ngl = f"-ngl {args.ngl}"
    if args.split_mode == "none":
        return f"{ngl} -sm none -mg {args.main_gpu}"
    if args.ts and any(args.ts):
        return f"{ngl} -ts {','.join(f'{t:g}' for t in args.ts)}"
    return f"{ngl}, free {'/'.join(f'{gb:g}' for gb in args.free_gb)} GB"


def _print_table(split: LlamaCppSplit, args: argparse.Namespace) -> None:
    label = _label(args)
    width = max(22, len(label))  # the lesson's column width; longer labels push both lines alike
    print(f"{label:<{width}}: {split.describe()}")
    gpu_layers = split.n_layer - split.cpu_layers
    per_gpu = ", ".join(f"GPU{g} {n}" for g, n in enumerate(split.layers_per_gpu)) or "no GPUs"
    share = f"{100 * split.gpu_layer_fraction:.0f}%"
    print(f"{'layers on GPUs':<{width}}: {gpu_layers} of {split.n_layer} ({share}); {per_gpu}")


def _as_json(split: LlamaCppSplit, args: argparse.Namespace) -> dict[str, object]:
    return {
        "n_layer": split.n_layer,
        "n_gpu_layers": args.ngl,
        "split_points": list(split.split_points),
        "devices": list(split.devices),
        "ranges": [asdict(r) | {"layers": r.layers} for r in split.ranges],
        "output_device": split.output_device,
        "layers_per_gpu": list(split.layers_per_gpu),
        "cpu_layers": split.cpu_layers,
        "gpu_layer_fraction": split.gpu_layer_fraction,
        "line": split.describe(),
    }
