"""`flotilla plan fit`: weights, KV cache, GPUs needed and weight-read time (the lesson's Example 1).

Also home of the flag helpers the other topics share: a model by name or by explicit shape,
a GPU by name or by explicit figures, and ``--catalogue FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from fake_engines.perf.catalogue import (
    Catalogue,
    CatalogueError,
    GpuSpec,
    ModelSpec,
    load_catalogue,
    model_from_shape,
)
from fake_engines.perf.memory import PRECISIONS_BITS, FitReport, fit
from fake_engines.perf.rounding import fixed
from flotilla.errors import FlagError
from flotilla.plan.units import si_json

HELP = "weights, KV cache, GPUs needed and weight-read time for a model, users and context"
DESCRIPTION = """\
Does a model fit, and how many GPUs does it need?
For each model and precision: weights GB, KV cache GB for USERS sequences of CONTEXT tokens,
the total, the GPUs needed when USABLE of each GPU's memory holds weights plus cache, and the
time to read the weights once (the floor of one decode step) on one GPU and split over them.

examples:
  flotilla plan fit                                   # the lesson's table: Llama 3.1 8B/70B/405B
  flotilla plan fit --model llama-3.1-70b --bits 16 --users 32 --context 8192
  flotilla plan fit --model qwen2.5-72b --gpu h200
  flotilla plan fit --params 70.6e9 --layers 80 --kv-heads 8 --head-dim 128 --gpu-memory-gb 80 --usable 0.9 --bandwidth-tbs 3.35"""

LESSON_MODELS = (("llama-3.1-8b", "8B"), ("llama-3.1-70b", "70B"), ("llama-3.1-405b", "405B"))


class PlanError(FlagError):
    """Bad flags: printed as one line on stderr, exit status 2."""


def add_catalogue_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalogue", action="append", default=[], metavar="FILE",
                        help="extra YAML catalogue adding or overriding GPUs, links and models by name (repeatable)")


def add_model_arguments(parser: argparse.ArgumentParser, repeat: bool = False) -> None:
    parser.add_argument("--model", action="append" if repeat else "store", metavar="NAME",
                        help="catalogue model name, e.g. llama-3.1-70b" + (" (repeatable)" if repeat else ""))
    shape = parser.add_argument_group("explicit model shape (instead of --model)")
    shape.add_argument("--params", type=float, help="parameters, all experts included, e.g. 70.6e9")
    shape.add_argument("--active-params", type=float, help="parameters used per token (MoE); default --params")
    shape.add_argument("--layers", type=int, help="transformer layers (num_hidden_layers)")
    shape.add_argument("--kv-heads", type=int, help="key/value attention heads (num_key_value_heads)")
    shape.add_argument("--head-dim", type=int, default=128, help="width of one attention head (default 128)")
    shape.add_argument("--hidden", type=int, help="hidden size (width of the residual stream)")
    shape.add_argument("--heads", type=int, help="query attention heads")
    shape.add_argument("--label", help="name printed for the explicit shape (default: custom)")


def add_gpu_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    g = parser.add_argument_group("GPU (a catalogue name, or explicit figures that override it)")
    g.add_argument("--gpu", default=default, metavar="NAME", help=f"catalogue GPU name (default {default})")
    g.add_argument("--gpu-memory-gb", type=float, help="memory of one GPU, GB (1e9 bytes)")
    g.add_argument("--bandwidth-tbs", type=float, help="memory bandwidth of one GPU, TB/s")
    g.add_argument("--tflops", type=float, help="dense BF16 throughput of one GPU, TFLOP/s")


def catalogue(args: argparse.Namespace) -> Catalogue:
    return load_catalogue(args.catalogue)


def explicit_shape(args: argparse.Namespace) -> ModelSpec | None:
    """The model given by shape flags, or None when --params is absent."""
    if args.params is None:
        return None
    missing = [flag for flag, v in (("--layers", args.layers), ("--kv-heads", args.kv_heads)) if v is None]
    if missing:
        raise PlanError(f"an explicit shape with --params also needs {' and '.join(missing)}")
    extra = {k: getattr(args, k) for k in ("hidden", "heads") if getattr(args, k, None)}
    return model_from_shape(args.params, args.layers, args.kv_heads, args.head_dim,
                            active_params=args.active_params, name=args.label or "custom", **extra)


def resolve_gpu(args: argparse.Namespace, cat: Catalogue) -> GpuSpec:
    """The named GPU with any explicit figures put over it."""
    base = cat.gpu(args.gpu)
    flags = {"memory_gb": ("--gpu-memory-gb", args.gpu_memory_gb),
             "bandwidth_tbs": ("--bandwidth-tbs", args.bandwidth_tbs),
             "bf16_tflops": ("--tflops", getattr(args, "tflops", None))}
    over = {key: value for key, (_, value) in flags.items() if value is not None}
    for key, value in over.items():
        if value <= 0:
            raise PlanError(f"{flags[key][0]} must be positive, got {value:g}")
    return GpuSpec(**{**asdict(base), **over, "name": base.name if not over else f"{base.name} (edited)"})


def fail(topic: str, exc: Exception) -> int:
    print(f"flotilla plan {topic}: error: {exc}", file=sys.stderr)
    return 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, repeat=True)
    parser.add_argument("--bits", type=float,
                        help="bits per weight, e.g. 16 (BF16), 8 (FP8/INT8), 4.5 (4-bit with scales); "
                             "default: all three")
    parser.add_argument("--users", type=int, default=32, help="sequences held at once (default 32)")
    parser.add_argument("--context", type=int, default=8192, help="tokens per sequence, prompt plus output (default 8192)")
    parser.add_argument("--kv-bytes", type=int, default=2, help="bytes per KV value (default 2, BF16; 1 for FP8)")
    add_gpu_arguments(parser, default="h100")
    parser.add_argument("--usable", type=float, default=0.9,
                        help="share of each GPU's memory given to weights and KV cache (default 0.9)")
    add_catalogue_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def _models(args: argparse.Namespace, cat: Catalogue) -> list[tuple[str, ModelSpec]]:
    shape = explicit_shape(args)
    if shape is not None:
        return [(shape.name, shape)]
    if args.model:
        return [(name, cat.model(name)) for name in args.model]
    return [(label, cat.model(name)) for name, label in LESSON_MODELS]


def _reports(args: argparse.Namespace) -> tuple[list[tuple[str, ModelSpec]], list[FitReport]]:
    if not 0 < args.usable <= 1:
        raise PlanError(f"--usable must be in (0, 1], got {args.usable}")
    if args.users < 1 or args.context < 1:
        raise PlanError("--users and --context must be at least 1")
    cat = catalogue(args)
    gpu = resolve_gpu(args, cat)
    models = _models(args, cat)
    bits = [args.bits] if args.bits else list(PRECISIONS_BITS)
    reports = [fit(m, b, args.users, args.context, gpu.memory_bytes * args.usable, gpu.bandwidth_bytes_s,
                   args.kv_bytes) for _, m in models for b in bits]
    return models, reports


def run(args: argparse.Namespace) -> int:
    try:
        models, reports = _reports(args)
    except (PlanError, CatalogueError) as exc:
        return fail("fit", exc)
    if args.json:
        print(json.dumps(si_json([{**asdict(r), "total_bytes": r.total_bytes} for r in reports]), indent=2))
        return 0
    labels = {m.name: label for label, m in models}
    width = max([5] + [len(label) for label in labels.values()])
    print(f"{'model':<{width}}  bits  weights GB  KV GB  total GB  GPUs  read ms, 1 GPU  read ms, split")
    for r in reports:
        print(_row(labels[r.model], width, r))
    for label, m in models:
        print(f"KV cache per token, {label}: {fixed(m.kv_bytes_per_token(args.kv_bytes) / 1024, 0)} KiB")
    return 0


def _row(label: str, width: int, r: FitReport) -> str:
    cells = [(fixed(r.bits, 1), 4), (fixed(r.weights_bytes / 1e9, 1), 10), (fixed(r.kv_bytes / 1e9, 1), 5),
             (fixed(r.total_bytes / 1e9, 1), 8), (str(r.gpus), 4), (fixed(r.read_1gpu_s * 1e3, 1), 13),
             (fixed(r.read_split_s * 1e3, 1), 14)]
    return f"{label:<{width}}  " + "  ".join(text.rjust(w) for text, w in cells)
