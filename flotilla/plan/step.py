"""`flotilla plan step`: the time of one engine step from the calibrated step-time model."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from fake_engines.perf.batch import Layout, StepBatch
from fake_engines.perf.catalogue import CatalogueError
from fake_engines.perf.kv_cache import KvCacheMemoryError, kv_cache_blocks
from fake_engines.perf.rounding import fixed
from fake_engines.perf.step_time import device_work, step_breakdown
from flotilla.plan.fit import (
    PlanError,
    add_catalogue_argument,
    add_gpu_arguments,
    add_model_arguments,
    catalogue,
    explicit_shape,
    fail,
    resolve_gpu,
)
from flotilla.plan.units import si_json

HELP = "time of one engine step (decode batch and/or prefill) on a GPU and parallel layout"
DESCRIPTION = """\
One engine step = one forward pass. Its time is a roofline of the bytes each GPU reads (its
share of the weights, the KV cache of every decoding sequence) against its arithmetic, plus a
per-layer launch overhead, plus tensor-parallel all-reduces and expert-parallel all-to-alls on
the link, with pipeline stages run one after another. The efficiency constants are calibrated
on real H200 measurements of a Llama-3.1-8B-shaped model.

examples:
  flotilla plan step --model llama-3.1-8b --gpu h200 --batch 64 --context 2048
  flotilla plan step --model llama-3.1-8b --gpu h200 --prefill-tokens 2048
  flotilla plan step --model llama-3.1-70b --gpu h100 --batch 32 --context 4096 -tp 4 --link pcie4
  flotilla plan step --model qwen3-30b-a3b --gpu h100 --batch 64 -dp 4 --enable-expert-parallel"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_gpu_arguments(parser, default="h200")
    work = parser.add_argument_group("the step")
    work.add_argument("--batch", type=int, default=0, help="decoding sequences, one new token each (default 0)")
    work.add_argument("--context", type=int, default=2048,
                      help="tokens already cached per decoding sequence (default 2048)")
    work.add_argument("--prefill-tokens", type=int, default=0, help="prompt tokens computed in the step (default 0)")
    work.add_argument("--prompts", type=int, default=1,
                      help="prompts the prefill tokens are shared over, each starting from empty (default 1)")
    work.add_argument("--dtype-bytes", type=int, default=2, help="bytes per weight and KV value (default 2, BF16)")
    lay = parser.add_argument_group("layout (vLLM flags)")
    lay.add_argument("-tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                     help="GPUs each layer is split over (default 1)")
    lay.add_argument("-pp", "--pipeline-parallel-size", dest="pp", type=int, default=1,
                     help="pipeline stages the layers are cut into (default 1)")
    lay.add_argument("-dp", "--data-parallel-size", dest="dp", type=int, default=1,
                     help="data-parallel ranks; with expert parallelism they share the experts (default 1)")
    lay.add_argument("-ep", "--enable-expert-parallel", dest="ep", action="store_true",
                     help="MoE layers hold whole experts per GPU over tp x dp GPUs")
    lay.add_argument("--link", default="nvlink", help="catalogue link between the GPUs (default nvlink)")
    lay.add_argument("--gpu-layer-fraction", type=float, default=1.0,
                     help="share of layers on the GPU, the rest on the CPU (llama.cpp -ngl; default 1)")
    lay.add_argument("--expert-imbalance", type=float, default=1.0,
                     help="busiest expert-parallel GPU's work over the mean (default 1, balanced)")
    lay.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                     help="share of GPU memory the engine takes, for the KV-cache capacity line (default 0.9)")
    add_catalogue_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def _batch(args: argparse.Namespace) -> StepBatch:
    if min(args.batch, args.context, args.prefill_tokens) < 0 or args.prompts < 1:
        raise PlanError("--batch, --context and --prefill-tokens must not be negative, --prompts at least 1")
    if args.batch == 0 and args.prefill_tokens == 0:
        raise PlanError("give --batch N (decoding sequences) and/or --prefill-tokens N")
    per = args.prefill_tokens // args.prompts
    pairs = args.prompts * per * (per + 1) // 2
    return StepBatch(prefill_tokens=args.prefill_tokens, prefill_attended_tokens=pairs,
                     decode_seqs=args.batch, decode_context_tokens=args.batch * args.context)


def _inputs(args: argparse.Namespace):
    cat = catalogue(args)
    model = explicit_shape(args) or cat.model(args.model or "llama-3.1-8b")
    layout = Layout(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, link=args.link,
                    gpu_layer_fraction=args.gpu_layer_fraction)
    return model, resolve_gpu(args, cat), layout, cat.link(args.link), _batch(args)


def run(args: argparse.Namespace) -> int:
    try:
        model, gpu, layout, link, batch = _inputs(args)
        parts = step_breakdown(model, gpu, batch, layout, link, args.dtype_bytes, args.expert_imbalance)
    except (PlanError, CatalogueError, ValueError) as exc:
        return fail("step", exc)
    work = device_work(model, batch, layout, args.dtype_bytes, args.expert_imbalance).scaled(1 / layout.pp)
    try:
        blocks: int | str = kv_cache_blocks(model, gpu, layout, args.gpu_memory_utilization,
                                            dtype_bytes=args.dtype_bytes)
    except KvCacheMemoryError as exc:
        blocks = str(exc)
    doc = {"model": model.name, "gpu": gpu.name, "layout": asdict(layout), "batch": asdict(batch),
           "per_gpu": asdict(work), "step_s": parts.pass_s, "interval_s": parts.interval_s,
           "compute_s": parts.compute_s, "allreduce_s": parts.allreduce_s, "all_to_all_s": parts.all_to_all_s,
           "transfer_s": parts.transfer_s, "tokens_per_s": batch.tokens / parts.interval_s,
           "kv_cache_blocks": blocks}
    if args.json:
        print(json.dumps(si_json(doc), indent=2))
        return 0
    _print(args, doc, batch, layout)
    return 0


def _print(args: argparse.Namespace, doc: dict, batch: StepBatch, layout: Layout) -> None:
    what = []
    if batch.decode_seqs:
        what.append(f"decode {batch.decode_seqs} sequences x {args.context} context")
    if batch.prefill_tokens:
        what.append(f"prefill {batch.prefill_tokens} tokens over {args.prompts} prompt(s)")
    print(f"{doc['model']} on {doc['gpu']}, tp {layout.tp} pp {layout.pp} dp {layout.dp}"
          f"{' ep' if layout.ep else ''}, link {layout.link}: " + " + ".join(what))
    w = doc["per_gpu"]
    rows = [("weights read per GPU, GB", fixed(w["weight_bytes"] / 1e9, 2)),
            ("KV read and written per GPU, GB", fixed(w["kv_bytes"] / 1e9, 2)),
            ("arithmetic per GPU, TFLOP", fixed(w["flops"] / 1e12, 3)),
            ("roofline compute per stage, ms", fixed(doc["compute_s"] * 1e3, 3)),
            ("tensor-parallel all-reduce, ms", fixed(doc["allreduce_s"] * 1e3, 3)),
            ("expert all-to-all, ms", fixed(doc["all_to_all_s"] * 1e3, 3)),
            ("stage-to-stage transfer, ms", fixed(doc["transfer_s"] * 1e3, 3)),
            ("step time, ms", fixed(doc["step_s"] * 1e3, 3)),
            ("time between completed steps, ms", fixed(doc["interval_s"] * 1e3, 3)),
            ("tokens per second" + (f" ({layout.pp} in flight)" if layout.pp > 1 else ""),
             fixed(doc["tokens_per_s"], 0))]
    blocks = doc["kv_cache_blocks"]
    rows.append(("KV-cache blocks of 16 tokens per GPU", str(blocks) if isinstance(blocks, int) else "none"))
    for label, value in rows:
        print(f"  {label:<36} {value:>12}")
    if not isinstance(blocks, int):
        print(f"  {blocks}")
