"""How long one engine step takes: a roofline over memory reads and arithmetic, plus the
interconnect costs of tensor, pipeline and expert parallelism.

Efficiency constants were calibrated once, on ``calibration/h200-llama-3.1-8b.json`` (real H200
measurements of a Llama-3.1-8B-shaped model in plain PyTorch: decode replayed as a CUDA graph,
prefill eager). They are global, not per row: the same six numbers predict every row within
8 %, and they carry over to other models because each term scales with that model's bytes,
FLOPs and layer count.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fake_engines.perf.allreduce import pass_traffic
from fake_engines.perf.batch import Layout, StepBatch
from fake_engines.perf.catalogue import GpuSpec, LinkSpec, ModelSpec, load_catalogue
from fake_engines.perf.lora import LoraStepCost

ONE_GPU = Layout()
"""The default layout: one GPU, no parallelism."""

ACHIEVED_BANDWIDTH_SHARE = 0.88
"""Share of the datasheet memory bandwidth that streaming reads reach: the calibration file's
2 GiB device-to-device copy ceiling, 4224.8 GB/s on a 4.8 TB/s part. Not fitted."""

ACHIEVED_FLOP_SHARE = 0.64
"""Share of the datasheet dense BF16 rate that the model's matmuls and attention reach: fitted on
the calibration prefill rows of 2048+ tokens (~630 TFLOP/s). The file's 8192^3 matmul ceiling
is 809 TFLOP/s (0.82); a model's narrower matmuls and attention fall short of it."""

GRAPH_OVERHEAD_PER_LAYER_S = 40e-6
"""Per-layer cost of a step replayed as a CUDA graph (decode-only steps): ~35 small kernels per
layer (norms, rotary, activations, residual adds) at ~1 us each. Fitted: the batch-1 decode row
is ~1.6 ms slower than its weight read."""

EAGER_LAUNCH_PER_LAYER_S = 230e-6
"""CPU time to launch one layer's kernels eagerly (steps with prefill tokens are not captured
as graphs): the GPU cannot finish before the launches do. Fitted on the 128-token prefill row,
which takes 7.7 ms while its reads and arithmetic need ~4."""

FIXED_OVERHEAD_S = 0.3e-3
"""Per-step cost independent of the layer count: embedding lookup, LM-head launch, sampling.
An assumption: one model's rows cannot separate it from the per-layer terms."""

ROOFLINE_SHARPNESS = 2.0
"""Exponent p of the smooth roofline (mem^p + compute^p)^(1/p): memory and compute overlap only
partly inside real kernels, so a step near the ridge is slower than max(mem, compute). Fitted on
the decode rows of batch 128 and 256, which sit near the ridge."""


@dataclass(frozen=True)
class DeviceWork:
    """What one GPU (or the CPU) does for its layers in one forward pass."""

    weight_bytes: float
    """Weight bytes it reads."""
    kv_bytes: float
    """KV-cache bytes it reads (decode context) and writes (new tokens)."""
    flops: float
    """Arithmetic: matmuls plus attention."""
    layers: float
    """Transformer layers it runs (for the per-layer overhead)."""

    def scaled(self, share: float) -> DeviceWork:
        return DeviceWork(self.weight_bytes * share, self.kv_bytes * share, self.flops * share,
                          self.layers * share)


@dataclass(frozen=True)
class StepTime:
    """The parts of one step's time."""

    stage_s: float
    """One pipeline stage: its compute plus its tensor-parallel and all-to-all traffic."""
    compute_s: float
    """Roofline time of one stage's reads and arithmetic (GPU and CPU layers)."""
    allreduce_s: float
    """Tensor-parallel all-reduce time of one stage (bandwidth plus ring-step latency)."""
    all_to_all_s: float
    """Expert-parallel dispatch and combine time of one stage."""
    transfer_s: float
    """Activations handed from one pipeline stage to the next."""
    pp: int
    """Pipeline stages."""

    @property
    def pass_s(self) -> float:
        """One batch through every stage: the step time an engine with one batch in flight sees."""
        return self.pp * self.stage_s + (self.pp - 1) * self.transfer_s

    @property
    def interval_s(self) -> float:
        """Time between successive completed batches with pp batches in flight."""
        return self.stage_s + (self.transfer_s if self.pp > 1 else 0.0)


@functools.lru_cache(maxsize=1)
def _builtin_catalogue():
    return load_catalogue()


def _smooth_max(mem_s: Any, comp_s: Any) -> Any:
    """(mem^p + comp^p)^(1/p) of floats or numpy arrays."""
    p = ROOFLINE_SHARPNESS
    if p == 2.0:  # products and sqrt round exactly, so scalar and vectorised results agree bit for bit
        squares = mem_s * mem_s + comp_s * comp_s
        return math.sqrt(squares) if isinstance(squares, float) else np.sqrt(squares)
    return (mem_s ** p + comp_s ** p) ** (1 / p)


def roofline_s(work: DeviceWork, device: GpuSpec, eager: bool = False) -> float:
    """Smooth roofline of reads against arithmetic, each side paying the per-layer overhead;
    an eager step also waits for its kernel launches."""
    fixed = FIXED_OVERHEAD_S * (work.layers > 0)
    overhead = fixed + GRAPH_OVERHEAD_PER_LAYER_S * work.layers
    mem = (work.weight_bytes + work.kv_bytes) / (device.bandwidth_bytes_s * ACHIEVED_BANDWIDTH_SHARE)
    comp = work.flops / (device.flops_s * ACHIEVED_FLOP_SHARE)
    gpu_s = _smooth_max(overhead + mem, overhead + comp)
    return max(gpu_s, fixed + EAGER_LAUNCH_PER_LAYER_S * work.layers) if eager else gpu_s


def _expert_hit_share(model: ModelSpec, tokens: float) -> float:
    """Expected share of experts that at least one of ``tokens`` is routed to."""
    return 1.0 - (1.0 - model.top_k / model.experts) ** tokens


def _kv_share(model: ModelSpec, tp: int) -> float:
    # KV heads split over TP ranks until one head per rank; MLA's latent is replicated
    if model.kv_latent_dim or model.kv_heads <= 0:
        return 1.0
    return max(1.0, model.kv_heads / tp) / model.kv_heads


def device_work(model: ModelSpec, batch: StepBatch, layout: Layout, dtype_bytes: int = 2,
                expert_imbalance: float = 1.0, kv_dtype_bytes: float | None = None,
                lora: LoraStepCost | None = None) -> DeviceWork:
    """Reads and arithmetic of one GPU over all layers (before the pipeline split); the KV cache
    holds `kv_dtype_bytes` per element (vLLM --kv-cache-dtype, llama.cpp -ctk/-ctv), else `dtype_bytes`."""
    tp = layout.tp
    dense_params = model.params - model.expert_params - model.embedding_params
    flops = 2.0 * dense_params * batch.tokens / tp
    weight_bytes = dense_params * dtype_bytes / tp
    if model.is_moe:
        expert_bytes, expert_flops = _expert_work(model, batch, layout, dtype_bytes, expert_imbalance)
        weight_bytes += expert_bytes
        flops += expert_flops
    attended = batch.decode_context_tokens + batch.prefill_attended_tokens
    flops += 4.0 * model.layers * model.heads * model.head_dim * attended / tp
    kv_tokens = batch.decode_context_tokens + batch.prefill_tokens
    kv_bytes = model.kv_bytes_per_token(kv_dtype_bytes or dtype_bytes) * kv_tokens * _kv_share(model, tp)
    if lora is not None and batch.lora_adapters:  # the adapters' shrink and expand beside each matmul
        weight_bytes += lora.weight_bytes(batch.lora_adapters)
        flops += lora.flops(batch.tokens)
    return DeviceWork(weight_bytes=weight_bytes, kv_bytes=kv_bytes, flops=flops, layers=model.layers)


def _expert_work(model: ModelSpec, batch: StepBatch, layout: Layout, dtype_bytes: int,
                 imbalance: float) -> tuple[float, float]:
    """Expert weight bytes read and expert FLOPs of one GPU; EP shares experts over tp x dp GPUs."""
    per_expert_params = model.expert_params / model.experts
    group = layout.tp * layout.dp if layout.ep else layout.tp
    tokens = batch.tokens * (layout.dp if layout.ep else 1)  # EP ranks run their MoE layers together
    hit = _expert_hit_share(model, tokens)
    read = model.experts * hit * per_expert_params * dtype_bytes / group
    flops = 2.0 * tokens * model.top_k * per_expert_params / group
    return read * (imbalance if layout.ep else 1.0), flops * (imbalance if layout.ep else 1.0)


def _all_to_all_s(model: ModelSpec, batch: StepBatch, layout: Layout, link: LinkSpec,
                  layers: float, dtype_bytes: int) -> float:
    """Dispatch plus combine per MoE layer: each token copy bound for another GPU, both ways."""
    if not (model.is_moe and layout.ep):
        return 0.0
    group = layout.tp * layout.dp
    if group <= 1:
        return 0.0
    copies = batch.tokens / layout.tp * model.top_k * (group - 1) / group
    per_layer = copies * model.hidden * dtype_bytes * 2 / link.bytes_s + 2 * link.latency_s
    return per_layer * layers


def _stage_compute_s(work: DeviceWork, gpu: GpuSpec, cpu: GpuSpec, gpu_layer_fraction: float,
                     eager: bool) -> float:
    # llama.cpp -ngl: layers left on the CPU run there after the GPU layers, at host memory speed
    if gpu_layer_fraction >= 1.0:
        return roofline_s(work, gpu, eager)
    on_cpu = work.scaled(1.0 - gpu_layer_fraction)
    return roofline_s(work.scaled(gpu_layer_fraction), gpu, eager) + roofline_s(on_cpu, cpu, eager)


def step_breakdown(model: ModelSpec, gpu: GpuSpec, batch: StepBatch, layout: Layout = ONE_GPU,
                   link: LinkSpec | None = None, dtype_bytes: int = 2, expert_imbalance: float = 1.0,
                   cpu: GpuSpec | None = None, kv_dtype_bytes: float | None = None,
                   lora: LoraStepCost | None = None) -> StepTime:
    """Every term of one step's time; ``step_time_s`` is its ``pass_s``."""
    _check(batch, layout)
    link = link or _builtin_catalogue().link(layout.link)
    cpu = cpu or _builtin_catalogue().gpu("cpu")
    work = device_work(model, batch, layout, dtype_bytes, expert_imbalance, kv_dtype_bytes, lora).scaled(1.0 / layout.pp)
    # steps with prompt tokens run eagerly; decode-only steps replay a captured graph (unless --enforce-eager)
    compute = _stage_compute_s(work, gpu, cpu, layout.gpu_layer_fraction,
                               eager=layout.eager or batch.prefill_tokens > 0)
    stage_layers = model.layers / layout.pp
    allreduce = 0.0
    if layout.tp > 1:
        traffic = pass_traffic(batch.tokens, model.hidden, 1, layout.tp, dtype_bytes)
        allreduce = traffic.time_s(link) * stage_layers
    a2a = _all_to_all_s(model, batch, layout, link, stage_layers, dtype_bytes)
    transfer = batch.tokens * model.hidden * dtype_bytes / link.bytes_s + link.latency_s
    return StepTime(stage_s=compute + allreduce + a2a, compute_s=compute, allreduce_s=allreduce,
                    all_to_all_s=a2a, transfer_s=transfer if layout.pp > 1 else 0.0, pp=layout.pp)


def _check(batch: StepBatch, layout: Layout) -> None:
    for name in ("tp", "pp", "dp"):
        if getattr(layout, name) < 1:
            raise ValueError(f"Layout.{name} must be at least 1, got {getattr(layout, name)}")
    if not 0.0 <= layout.gpu_layer_fraction <= 1.0:
        raise ValueError(f"Layout.gpu_layer_fraction must be within [0, 1], got {layout.gpu_layer_fraction}")
    if batch.prefill_tokens < 0 or batch.decode_seqs < 0 or batch.decode_context_tokens < 0:
        raise ValueError("StepBatch token counts must not be negative")


def step_time_s(model: ModelSpec, gpu: GpuSpec, batch: StepBatch, layout: Layout = ONE_GPU,
                link: LinkSpec | None = None, dtype_bytes: int = 2, expert_imbalance: float = 1.0,
                kv_dtype_bytes: float | None = None, lora: LoraStepCost | None = None) -> float:
    """Seconds for one batch to pass through the whole model (every pipeline stage in turn)."""
    return step_breakdown(model, gpu, batch, layout, link, dtype_bytes, expert_imbalance,
                          kv_dtype_bytes=kv_dtype_bytes, lora=lora).pass_s


def pipeline_step_interval_s(model: ModelSpec, gpu: GpuSpec, batch: StepBatch, layout: Layout = ONE_GPU,
                             link: LinkSpec | None = None, dtype_bytes: int = 2,
                             expert_imbalance: float = 1.0) -> float:
    """Seconds between successive completed batches when pp batches are in flight."""
    return step_breakdown(model, gpu, batch, layout, link, dtype_bytes, expert_imbalance).interval_s


def decode_batch(seqs: int, context_tokens: int) -> StepBatch:
    """A decode step of ``seqs`` sequences that each hold ``context_tokens`` cached tokens."""
    return StepBatch(decode_seqs=seqs, decode_context_tokens=seqs * context_tokens)


def prefill_batch(prompts: int, prompt_tokens: int) -> StepBatch:
    """A step prefilling ``prompts`` fresh prompts of ``prompt_tokens`` each (causal attention)."""
    pairs = prompts * prompt_tokens * (prompt_tokens + 1) // 2
    return StepBatch(prefill_tokens=prompts * prompt_tokens, prefill_attended_tokens=pairs)


def _plain(model: ModelSpec, layout: Layout) -> bool:
    """One dense model on one GPU: no interconnect term, so decode steps take the closed form."""
    return (not model.is_moe and layout.tp == 1 and layout.pp == 1 and layout.dp == 1
            and layout.gpu_layer_fraction >= 1.0 and not layout.eager)


def decode_run_s(model: ModelSpec, gpu: GpuSpec, first: StepBatch, context_step: int, num_steps: int,
                 layout: Layout = ONE_GPU, link: LinkSpec | None = None, dtype_bytes: int = 2,
                 expert_imbalance: float = 1.0) -> list[float]:
    """`step_time_s` of `num_steps` decode steps, the i-th holding `i * context_step` more context
    tokens than `first`, bit for bit; one vectorised pass in the common single-GPU case."""
    return decode_run_array_s(model, gpu, first, context_step, num_steps, layout, link, dtype_bytes,
                              expert_imbalance).tolist()


def decode_run_array_s(model: ModelSpec, gpu: GpuSpec, first: StepBatch, context_step: int, num_steps: int,
                       layout: Layout = ONE_GPU, link: LinkSpec | None = None, dtype_bytes: int = 2,
                       expert_imbalance: float = 1.0, kv_dtype_bytes: float | None = None,
                       lora: LoraStepCost | None = None) -> np.ndarray:
    """`decode_run_s` as a float64 array, for callers that go on computing with numpy."""
    if first.prefill_tokens or not _plain(model, layout) or (lora is not None and first.lora_adapters):
        return np.array([step_time_s(model, gpu, replace(first, decode_context_tokens=first.decode_context_tokens
                                                          + i * context_step), layout, link, dtype_bytes,
                                     expert_imbalance, kv_dtype_bytes, lora)
                         for i in range(num_steps)], dtype=np.float64)
    _check(first, layout)
    start = first.decode_context_tokens
    if context_step > 0:
        ctx = np.arange(start, start + context_step * num_steps, context_step, dtype=np.int64)
    else:
        ctx = start + context_step * np.arange(num_steps, dtype=np.int64)
    return _decode_roofline_s(model, gpu, first.tokens, ctx, dtype_bytes, kv_dtype_bytes or dtype_bytes)


def _decode_roofline_s(model: ModelSpec, gpu: GpuSpec, tokens: int, ctx: np.ndarray, dtype_bytes: int,
                       kv_dtype_bytes: float) -> np.ndarray:
    # the same operations, in the same order, as device_work and roofline_s with tp = pp = 1;
    # the scalar parts are folded first (Python evaluates them first too), the array ops that
    # are exact identities there (/ 1 and * 1.0 of a float array) are left out, and the rest run
    # in place, sums turned around (a + b == b + a in floating point): decode runs are short
    dense_params = model.params - model.expert_params - model.embedding_params
    comp = (4.0 * model.layers * model.heads * model.head_dim) * ctx
    comp += 2.0 * dense_params * tokens / 1
    mem = model.kv_bytes_per_token(kv_dtype_bytes) * ctx
    kv_share = _kv_share(model, 1)
    if kv_share != 1.0:
        mem = mem * kv_share
    mem = mem + dense_params * dtype_bytes / 1 * 1.0  # a float array even when the KV bytes are ints
    layers = model.layers * 1.0
    overhead = FIXED_OVERHEAD_S * (layers > 0) + GRAPH_OVERHEAD_PER_LAYER_S * layers
    mem /= gpu.bandwidth_bytes_s * ACHIEVED_BANDWIDTH_SHARE
    comp /= gpu.flops_s * ACHIEVED_FLOP_SHARE
    mem += overhead
    comp += overhead
    if ROOFLINE_SHARPNESS != 2.0:
        return _smooth_max(mem, comp)
    mem *= mem  # _smooth_max at p = 2, in place
    comp *= comp
    mem += comp
    return np.sqrt(mem, out=mem)
