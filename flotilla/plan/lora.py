"""`flotilla plan lora`: adapter sizes, vLLM's reserved adapter buffers, merged versus shared memory."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace

from fake_engines.perf.batch import Layout
from fake_engines.perf.catalogue import ModelSpec, load_catalogue, model_from_shape
from fake_engines.perf.lora import (
    LLAMA_MODULES,
    LoraShape,
    LoraStepCost,
    llama_modules,
    tenant_memory,
    vllm_adapter_buffer_bytes,
    vllm_adapter_buffer_bytes_per_gpu,
)
from fake_engines.perf.rounding import fixed, percent
from fake_engines.perf.step_time import decode_batch, step_time_s
from flotilla.plan.units import si_json

HELP = "LoRA adapter memory per rank, vLLM's --max-loras/--max-lora-rank buffers, merged vs shared models"
DESCRIPTION = """\
Sizes LoRA adapters for a Llama-shaped model. An adapted module with `in` inputs and
`out` outputs gains rank x (in + out) parameters (A is rank x in, B is out x rank).
vLLM reserves GPU buffers for --max-loras adapters at --max-lora-rank whatever is
loaded; the KV cache does not get that memory. --tenants compares one merged model per
fine-tuned variant with one base model plus one adapter per variant. --gpu adds what
adapters cost a decode step, as the look-alike vLLM times it: each distinct adapter in
the step reads its A and B at --max-lora-rank, and every token does 2 x rank x (in + out)
FLOPs per adapted module.

examples:
  flotilla plan lora --model llama-3.1-8b --ranks 8,16,64 --max-loras 4 --max-lora-rank 64 --tenants 20
  flotilla plan lora --params 8.03e9 --layers 32 --hidden 4096 --intermediate 14336 --kv-heads 8 --head-dim 128
  flotilla plan lora --model qwen2.5-7b --target-modules q_proj,v_proj --json
  flotilla plan lora --model llama-3.1-8b --max-loras 4 --max-lora-rank 16 --gpu h100 --batch 32"""

SHAPE_FLAGS = ("params", "layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim")


@dataclass(frozen=True)
class _Model:
    """What the LoRA sizing needs of the base model."""

    shape: LoraShape
    """Adapted modules and layer count."""
    base_bytes: float
    """Base model weights in bytes at --bits."""
    spec: ModelSpec | None = None
    """The whole shape, for step times (None when the flags name too little of it)."""


def int_list(text: str) -> list[int]:
    """Comma-separated integers, e.g. 8,16,64."""
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="catalogue model name (e.g. llama-3.1-8b); shape flags override its fields")
    parser.add_argument("--catalogue", action="append", default=[], metavar="FILE",
                        help="extra YAML catalogue adding or overriding models by name (repeatable)")
    shape = parser.add_argument_group("explicit shape (instead of or on top of --model)")
    shape.add_argument("--params", type=float, help="base model parameters, e.g. 8.03e9")
    shape.add_argument("--layers", type=int, help="transformer layers")
    shape.add_argument("--hidden", type=int, help="hidden size")
    shape.add_argument("--intermediate", type=int, help="MLP intermediate size (per expert for MoE)")
    shape.add_argument("--heads", type=int, help="attention query heads (default hidden / head-dim)")
    shape.add_argument("--kv-heads", type=int, help="key/value heads")
    shape.add_argument("--head-dim", type=int, help="width of one attention head (default 128)")
    parser.add_argument("--bits", type=float, default=16, help="bits per weight of the base model (default 16)")
    parser.add_argument("--target-modules", type=lambda t: t.split(","), default=list(LLAMA_MODULES),
                        help=f"adapted projections, comma-separated (default: {','.join(LLAMA_MODULES)})")
    parser.add_argument("--ranks", type=int_list, default=[8, 16, 64], help="adapter ranks to size (default 8,16,64)")
    parser.add_argument("--max-loras", type=int, default=1,
                        help="vLLM --max-loras: adapters in one batch, each a reserved GPU slot (default 1)")
    parser.add_argument("--max-lora-rank", type=int, default=16,
                        help="vLLM --max-lora-rank: rank every slot is sized for (default 16)")
    parser.add_argument("-tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                        help="vLLM -tp: also print the buffers each GPU holds (default 1)")
    parser.add_argument("--tenants", type=int, help="fine-tuned variants to serve: compare merged and shared memory")
    parser.add_argument("--tenant-rank", type=int, default=16, help="adapter rank of each variant (default 16)")
    parser.add_argument("--gpu", help="catalogue GPU: also print what 0 to --max-loras distinct adapters add to a "
                                      "decode step's time there")
    parser.add_argument("--batch", type=int, default=32, help="decode sequences in that step (default 32)")
    parser.add_argument("--context", type=int, default=2048, help="context tokens of each sequence (default 2048)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    try:
        model = _model(args)
        report = _report(model, args)
    except ValueError as exc:
        print(f"flotilla plan lora: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(si_json(report), indent=2))
    else:
        _print_table(report)
    return 0


def _model(args: argparse.Namespace) -> _Model:
    fields = {}
    if args.model:
        spec = load_catalogue(args.catalogue).model(args.model)
        fields = {f: getattr(spec, f) for f in SHAPE_FLAGS} | {"experts": spec.experts}
    fields |= {f: getattr(args, f) for f in SHAPE_FLAGS if getattr(args, f) is not None}
    fields.setdefault("head_dim", 128)
    missing = [f"--{f.replace('_', '-')}" for f in SHAPE_FLAGS if f != "heads" and not fields.get(f)]
    if missing:
        raise ValueError(f"model shape incomplete: give --model or {' '.join(missing)}")
    heads = fields.get("heads") or fields["hidden"] // fields["head_dim"]
    modules = llama_modules(fields["hidden"], fields["intermediate"], heads, fields["kv_heads"],
                            fields["head_dim"], args.target_modules, fields.get("experts", 0))
    spec = load_catalogue(args.catalogue).model(args.model) if args.model and not any(
        getattr(args, f) is not None for f in SHAPE_FLAGS) else model_from_shape(
        fields["params"], fields["layers"], fields["kv_heads"], fields["head_dim"], hidden=fields["hidden"],
        heads=heads, intermediate=fields["intermediate"])
    return _Model(LoraShape(modules, fields["layers"]), fields["params"] * args.bits / 8, spec)


def _report(model: _Model, args: argparse.Namespace) -> dict[str, object]:
    shape = model.shape
    report: dict[str, object] = {
        "params_per_rank_per_layer": shape.params_per_rank_per_layer,
        "base_bytes": model.base_bytes,
        "adapters": [{"rank": r, "params": shape.adapter_params(r), "bytes": shape.adapter_bytes(r),
                      "share_of_base": shape.adapter_bytes(r) / model.base_bytes} for r in args.ranks],
        "max_loras": args.max_loras,
        "max_lora_rank": args.max_lora_rank,
        "vllm_buffer_bytes": vllm_adapter_buffer_bytes(shape, args.max_loras, args.max_lora_rank),
        "tp": args.tp,
        "vllm_buffer_bytes_per_gpu": vllm_adapter_buffer_bytes_per_gpu(shape, args.max_loras,
                                                                       args.max_lora_rank, args.tp),
    }
    if args.gpu:
        report["step_cost"] = _step_cost(model, args)
    if args.tenants is not None:
        mem = tenant_memory(shape, model.base_bytes, args.tenants, args.tenant_rank)
        report["tenants"] = {"tenants": mem.tenants, "rank": args.tenant_rank,
                             "merged_bytes": mem.merged_bytes, "shared_bytes": mem.shared_bytes}
    return report


def _step_cost(model: _Model, args: argparse.Namespace) -> dict[str, object]:
    """Decode step times with 0..max_loras distinct adapters (the look-alike vLLM's perf model)."""
    if args.batch < 1 or args.context < 0:
        raise ValueError(f"--batch must be >= 1 and --context >= 0, got {args.batch}, {args.context}")
    assert model.spec is not None
    gpu = load_catalogue(args.catalogue).gpu(args.gpu)
    cost = LoraStepCost(model.shape, args.max_lora_rank, args.tp)
    layout, dtype_bytes = Layout(tp=args.tp), max(1, round(args.bits / 8))
    base = decode_batch(args.batch, args.context)
    times = [step_time_s(model.spec, gpu, replace(base, lora_adapters=k), layout, dtype_bytes=dtype_bytes, lora=cost)
             for k in range(args.max_loras + 1)]
    return {"gpu": gpu.name, "batch": args.batch, "context": args.context,
            "adapter_bytes_per_gpu": cost.weight_bytes(1), "adapter_flops_per_gpu": cost.flops(base.tokens),
            "step_s": times}


def _print_table(report: dict) -> None:
    print(f"LoRA parameters per rank per layer: {report['params_per_rank_per_layer']}")
    for a in report["adapters"]:
        print(f"rank {a['rank']:2d}: {a['params']:,} parameters, {fixed(a['bytes'] / 1e6, 1)} MB in BF16 "
              f"({percent(a['share_of_base'], 2)}% of the base model)")
    print(f"GPU adapter buffers for --max-loras {report['max_loras']} --max-lora-rank {report['max_lora_rank']}: "
          f"{fixed(report['vllm_buffer_bytes'] / 1e9, 2)} GB")
    if report["tp"] > 1:
        print(f"  each of the {report['tp']} GPUs of -tp {report['tp']} holds "
              f"{fixed(report['vllm_buffer_bytes_per_gpu'] / 1e9, 2)} GB of them")
    if "step_cost" in report:
        c = report["step_cost"]
        times = c["step_s"]
        print(f"decode step of {c['batch']} sequences x {c['context']} tokens on {c['gpu']}: "
              f"{fixed(times[0] * 1e3, 2)} ms without adapters")
        for k, t in enumerate(times[1:], start=1):
            print(f"  {k} distinct adapter{'s' if k > 1 else ''}: {fixed(t * 1e3, 2)} ms "
                  f"(+{fixed((t - times[0]) * 1e3, 3)} ms)")
        print(f"  each adapter: {fixed(c['adapter_bytes_per_gpu'] / 1e6, 1)} MB read per GPU per step; "
              f"the step's tokens add {fixed(c['adapter_flops_per_gpu'] / 1e9, 2)} GFLOP per GPU")
    if "tenants" in report:
        t = report["tenants"]
        print(f"{t['tenants']} fine-tuned variants: {fixed(t['merged_bytes'] / 1e9, 1)} GB as merged models, "
              f"{fixed(t['shared_bytes'] / 1e9, 1)} GB as one base plus rank-{t['rank']} adapters")
