"""From `fake-llama-server` flags to a sized engine: layer placement, slots, step time and cold start."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fake_engines.core import LlamaCppScheduler, LlamaCppSchedulerConfig
from fake_engines.factory.catalogue import catalogue_of
from fake_engines.factory.gguf import GgufModel
from fake_engines.factory.llamacpp_config import LlamaServerConfig
from fake_engines.perf import coldstart, step_time
from fake_engines.perf.batch import Layout, StepBatch
from fake_engines.perf.catalogue import GpuSpec
from fake_engines.perf.layout_llamacpp import LlamaCppSplit, assign_layers, assign_layers_single_gpu

LINK = "pcie4"
"""llama.cpp splits over whatever links the host has; PCIe 4 is the common case."""


@dataclass(frozen=True)
class LlamaEngineSpec:
    """The sized engine."""

    model: GgufModel
    """What -m loaded."""
    gpu: GpuSpec
    """The GPU type."""
    split: LlamaCppSplit
    """Which device holds each layer."""
    layout: Layout
    """The step-time model's view of the split."""
    cold_start_s: float
    """Start-up + weight load (+ one warm-up step), modelled seconds."""
    catalogue: tuple[str, ...] = ()
    """Extra catalogue files the GPU and link were looked up in."""
    kv_bytes: float = 2.0
    """Bytes per KV element (-ctk / -ctv; f16 by default, whatever the weights' quantisation)."""


def place_layers(config: LlamaServerConfig, n_layer: int) -> LlamaCppSplit:
    """-ngl / -sm / -ts / -mg to a per-layer device map (llama.cpp's split arithmetic)."""
    if config.split_mode == "none":
        return assign_layers_single_gpu(n_layer, config.n_gpu_layers, config.main_gpu, config.num_gpus)
    proportions = config.tensor_split or [1.0] * config.num_gpus
    return assign_layers(n_layer, config.n_gpu_layers, proportions)


def size_engine(config: LlamaServerConfig, model: GgufModel) -> LlamaEngineSpec:
    """Place the layers and time the cold start."""
    gpu = catalogue_of(config.catalogue).gpu(config.gpu)
    split = place_layers(config, model.spec.layers)
    layout = split.engine_layout(LINK)
    if config.split_mode in ("row", "tensor") and config.num_gpus > 1:
        # row/tensor split every matrix over the GPUs: tensor parallelism, not a pipeline
        layout = Layout(tp=config.num_gpus, link=LINK, gpu_layer_fraction=split.gpu_layer_fraction)
    spec_without_start = LlamaEngineSpec(model, gpu, split, layout, 0.0, config.catalogue, config.kv_bytes_per_element)
    warmup_s = step_time_fn(spec_without_start)(StepBatch(prefill_tokens=1, prefill_attended_tokens=1)) \
        if config.warmup else 0.0
    cold = coldstart.cold_start_s(model.size_bytes, config.load_gbps, config.startup_s, warmup_s)
    return LlamaEngineSpec(model, gpu, split, layout, cold, config.catalogue, config.kv_bytes_per_element)


def scheduler_config(config: LlamaServerConfig, model: GgufModel) -> LlamaCppSchedulerConfig:
    """The slots and batches these flags give (-c, -np, -b, -ub, --slot-prompt-similarity)."""
    return LlamaCppSchedulerConfig(
        n_ctx=config.n_ctx, n_parallel=config.n_parallel, n_ctx_train=model.n_ctx_train,
        slot_prompt_similarity=config.slot_prompt_similarity, n_batch=config.n_batch, n_ubatch=config.n_ubatch,
        seed=config.seed, cache_ram_tokens=cache_ram_tokens(config, model), kv_unified=config.kv_unified,
        cache_idle_slots=config.cache_idle_slots)


def cache_ram_tokens(config: LlamaServerConfig, model: GgufModel) -> int:
    """--cache-ram MiB as tokens of this model's KV at -ctk/-ctv (-1 no limit, 0 off)."""
    if config.cache_ram_mib <= 0:
        return config.cache_ram_mib
    per_token = model.spec.kv_bytes_per_token(config.kv_bytes_per_element)
    return max(1, int(config.cache_ram_mib * 2**20 // per_token))


def build_scheduler(config: LlamaServerConfig, model: GgufModel) -> LlamaCppScheduler:
    """The clock-free llama-server core for these flags."""
    return LlamaCppScheduler(scheduler_config(config, model))


def step_time_fn(spec: LlamaEngineSpec) -> Callable[[StepBatch], float]:
    """Seconds per llama_decode() call: one batch through every stage (no pipelining in llama.cpp)."""
    link = catalogue_of(spec.catalogue).link(LINK)
    weight_bytes = spec.model.bits_per_weight / 8

    def seconds(batch: StepBatch) -> float:
        # a GGUF's bytes per weight are fractional (4.85 bits for Q4_K_M); the perf model only multiplies by them
        return step_time.step_time_s(spec.model.spec, spec.gpu, batch, spec.layout, link,
                                     weight_bytes, kv_dtype_bytes=spec.kv_bytes)  # type: ignore[arg-type]

    return seconds
