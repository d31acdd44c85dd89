"""From `fake-vllm serve` flags to a sized engine: model, GPU, KV blocks, batch limits, step time, cold start.

The arithmetic lives in fake_engines.perf; this module wires flags to it, fills the defaults vLLM
fills (EngineArgs._set_default_args / get_batch_defaults, ModelConfig's max_model_len) and words
the refusals as vLLM does when a model does not fit.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fake_engines.core import VllmScheduler, VllmSchedulerConfig
from fake_engines.factory.catalogue import catalogue_of
from fake_engines.factory.vllm_config import (
    AUTO_MAX_MODEL_LEN,
    KV_CACHE_DTYPE_BYTES,
    ServeConfigError,
    VllmServeConfig,
    default_batch_limits,
)
from fake_engines.perf import coldstart, kv_cache, lora, step_time
from fake_engines.perf.batch import Layout, StepBatch
from fake_engines.perf.catalogue import Catalogue, CatalogueError, GpuSpec, ModelSpec, model_from_shape

GIB = 2**30
UNKNOWN_CONTEXT_LEN = 2048
"""vLLM's assumption when a model's config.json names no context length (here: an explicit shape)."""


class ModelDoesNotFit(RuntimeError):
    """The model and its KV cache cannot be placed on the configured GPUs (vLLM refuses to start)."""


@dataclass(frozen=True)
class VllmEngineSpec:
    """A sized engine: what the scheduler, the metrics and the cold start need."""

    model: ModelSpec
    """The served model's shape."""
    gpu: GpuSpec
    """The GPU it pretends to run on."""
    layout: Layout
    """tp / pp / dp / ep and the link between GPUs."""
    num_gpu_blocks: int
    """KV blocks of one engine."""
    kv_cache_memory_bytes: int
    """Memory given to the KV cache on each GPU."""
    max_num_seqs: int
    """Most running requests."""
    max_num_batched_tokens: int
    """Step token budget."""
    cold_start_s: float
    """Start-up + weight load + warm-up, modelled seconds."""
    max_model_len: int = 0
    """Longest prompt + output, resolved (the model's context length unless the flags say)."""


def resolve_model(name: str, catalogue: Catalogue | None = None) -> ModelSpec:
    """The catalogue model MODEL names: a catalogue name, a path or Hugging Face id whose last part
    names one, or an instruct / quantised variant of one (the catalogue's rule, Catalogue.model)."""
    catalogue = catalogue or catalogue_of()
    try:
        return catalogue.model(name)
    except CatalogueError as exc:
        raise ServeConfigError(f"model {name!r} is not in the catalogue: {exc}") from None


def model_of(config: VllmServeConfig) -> ModelSpec:
    """The explicit shape when given, else the catalogue entry MODEL names."""
    if config.model_shape is None:
        return resolve_model(config.model, catalogue_of(config.catalogue))
    shape = {k: v for k, v in config.model_shape.items() if v is not None}
    fixed = {k: shape.pop(k) for k in ("params", "layers", "kv_heads")}
    return model_from_shape(fixed["params"], int(fixed["layers"]), int(fixed["kv_heads"]),
                            int(shape.pop("head_dim", 128)), name=config.model, **{k: int(v) for k, v in shape.items()})


def size_engine(config: VllmServeConfig) -> VllmEngineSpec:
    """Size the engine for the flags, or raise ModelDoesNotFit in vLLM's words."""
    model = model_of(config)
    catalogue = catalogue_of(config.catalogue)
    gpu = catalogue.gpu(config.gpu)
    catalogue.link(config.link)  # an unknown link fails here, as the step-time model would later
    layout = Layout(tp=config.tensor_parallel_size, pp=config.pipeline_parallel_size,
                    dp=config.data_parallel_size, ep=config.enable_expert_parallel, link=config.link,
                    eager=config.enforce_eager)
    dtype_bytes = dtype_bytes_of(config)
    weights = kv_cache.weight_bytes_per_gpu(model, layout, dtype_bytes) - offloaded_bytes(config, model, layout)
    _check_weights_fit(weights, gpu)
    block_bytes = kv_cache.kv_bytes_per_token_per_gpu(model, layout, kv_dtype_bytes_of(config)) \
        * config.resolved_block_size
    blocks = config.num_gpu_blocks_override or _capacity_blocks(config, model, gpu, layout, dtype_bytes)
    max_model_len = _max_model_len(config, model, blocks)
    _check_max_model_len(max_model_len, config.resolved_block_size, blocks, block_bytes)
    tokens, seqs = batch_limits(config, gpu, max_model_len)
    load = coldstart.cold_start_s(weights, config.load_gbps, config.startup_s, config.warmup_s)
    return VllmEngineSpec(model=model, gpu=gpu, layout=layout, num_gpu_blocks=blocks,
                          kv_cache_memory_bytes=int(blocks * block_bytes), max_num_seqs=seqs,
                          max_num_batched_tokens=tokens, cold_start_s=load, max_model_len=max_model_len)


def resolved_config(config: VllmServeConfig, spec: VllmEngineSpec) -> VllmServeConfig:
    """`config` with the defaults vLLM fills at start filled in as `spec` sized them."""
    return dataclasses.replace(config, max_model_len=spec.max_model_len, max_num_seqs=spec.max_num_seqs,
                               max_num_batched_tokens=spec.max_num_batched_tokens,
                               served_model_name=config.model_name)


def context_length(model: ModelSpec) -> int:
    """The model's own context length (config.json), vLLM's default max_model_len."""
    return model.max_position_embeddings or UNKNOWN_CONTEXT_LEN


def _max_model_len(config: VllmServeConfig, model: ModelSpec, blocks: int) -> int:
    if config.max_model_len is None:
        return context_length(model)
    if config.max_model_len == AUTO_MAX_MODEL_LEN:
        # vLLM's auto-fit: the whole context if it fits, else what the cache holds, less the null
        # block (vLLM counts it, and a request of exactly that length would then wait forever)
        return max(1, min(context_length(model), (blocks - 1) * config.resolved_block_size))
    return config.max_model_len


def batch_limits(config: VllmServeConfig, gpu: GpuSpec, max_model_len: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) as vLLM's _set_default_max_num_seqs_and_batched_tokens_args
    fills the unset ones for the OpenAI server, and its SchedulerConfig refuses a budget below the seqs."""
    default_tokens, default_seqs = default_batch_limits(gpu.memory_gb, gpu.name)
    seqs = config.max_num_seqs or default_seqs
    tokens = config.max_num_batched_tokens or min(seqs * max_model_len, default_tokens)
    if config.max_num_seqs is None:
        seqs = min(seqs, tokens)
    if tokens < seqs:
        raise ServeConfigError(f"max_num_batched_tokens ({tokens}) must be greater than or equal to "
                               f"max_num_seqs ({seqs}) (--max-num-batched-tokens, --max-num-seqs)")
    return tokens, seqs


def dtype_bytes_of(config: VllmServeConfig) -> int:
    """Bytes per weight (and KV element unless --kv-cache-dtype says) for --dtype."""
    return max(1, round(config.weight_bits / 8))


def kv_dtype_bytes_of(config: VllmServeConfig) -> float:
    """Bytes per KV element: --kv-cache-dtype's, or the weights' for auto."""
    return KV_CACHE_DTYPE_BYTES[config.kv_cache_dtype] or dtype_bytes_of(config)


def offloaded_bytes(config: VllmServeConfig, model: ModelSpec, layout: Layout) -> float:
    """Weight bytes per GPU --cpu-offload-gb keeps in host memory (at most all of them)."""
    weights = kv_cache.weight_bytes_per_gpu(model, layout, dtype_bytes_of(config))
    return min(config.cpu_offload_gb * GIB, weights)


def _lora_shape(config: VllmServeConfig, model: ModelSpec, layers: int) -> lora.LoraShape | None:
    """The adapted projections (all seven of a Llama layer) over `layers`; None without --enable-lora
    or for a shape too sparse to adapt."""
    if not config.enable_lora or not (model.hidden and model.heads and model.intermediate):
        return None
    modules = lora.llama_modules(model.hidden, model.intermediate, model.heads, model.kv_heads, model.head_dim,
                                 experts=model.experts)
    return lora.LoraShape(modules, max(1, layers))


def lora_reserve_bytes(config: VllmServeConfig, model: ModelSpec, layout: Layout) -> float:
    """GPU memory vLLM sets aside for --max-loras adapters at --max-lora-rank (0 without --enable-lora)."""
    shape = _lora_shape(config, model, model.layers // layout.pp)
    if shape is None:
        return 0.0
    return lora.vllm_adapter_buffer_bytes_per_gpu(shape, config.max_loras, config.max_lora_rank, layout.tp)


def lora_step_cost(config: VllmServeConfig, model: ModelSpec, layout: Layout) -> lora.LoraStepCost | None:
    """What adapters add to a step that uses them (all layers; the pipeline split comes later)."""
    shape = _lora_shape(config, model, model.layers)
    return None if shape is None else lora.LoraStepCost(shape, config.max_lora_rank, layout.tp)


def _capacity_blocks(config: VllmServeConfig, model: ModelSpec, gpu: GpuSpec, layout: Layout,
                     dtype_bytes: int) -> int:
    # weights offloaded to the host free their GPU memory for the KV cache
    reserve_gb = (kv_cache.ACTIVATION_RESERVE_GB + lora_reserve_bytes(config, model, layout) / 1e9
                  - offloaded_bytes(config, model, layout) / 1e9)
    try:
        return kv_cache.kv_cache_blocks(model, gpu, layout, config.gpu_memory_utilization,
                                        config.resolved_block_size, dtype_bytes, reserve_gb,
                                        kv_dtype_bytes=kv_dtype_bytes_of(config))
    except kv_cache.KvCacheMemoryError as exc:
        raise ModelDoesNotFit(f"ValueError: {exc}") from None


def _check_weights_fit(weights_per_gpu: float, gpu: GpuSpec) -> None:
    if weights_per_gpu > gpu.memory_bytes:
        need, total = weights_per_gpu / GIB, gpu.memory_bytes / GIB
        raise ModelDoesNotFit(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need - total:.2f} GiB. GPU 0 has a "
            f"total capacity of {total:.2f} GiB of which 0 bytes is free. Loading the model weights needs "
            f"{need:.2f} GiB per GPU; use more GPUs (--tensor-parallel-size / --pipeline-parallel-size) or a "
            "smaller --dtype.")


def _check_max_model_len(max_model_len: int, block_size: int, blocks: int, block_bytes: float) -> None:
    """vLLM's check_enough_kv_cache_memory: the KV cache must hold one request of max_model_len."""
    capacity_tokens = blocks * block_size
    if capacity_tokens >= max_model_len:
        return
    needed = max_model_len / block_size * block_bytes / GIB
    available = blocks * block_bytes / GIB
    raise ModelDoesNotFit(
        f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
        f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({available:.2f} GiB). Based on the available memory, the estimated maximum model length is "
        f"{capacity_tokens}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.")


def build_scheduler(config: VllmServeConfig, spec: VllmEngineSpec) -> VllmScheduler:
    """The clock-free vLLM core for these flags, with the limits `spec` resolved."""
    return VllmScheduler(VllmSchedulerConfig(
        num_gpu_blocks=spec.num_gpu_blocks, max_model_len=spec.max_model_len or config.max_model_len,
        max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
        block_size=config.resolved_block_size, enable_prefix_caching=config.enable_prefix_caching,
        prefix_caching_hash_algo=config.prefix_caching_hash_algo, max_loras=config.max_loras,
        max_concurrent_batches=config.pipeline_parallel_size, async_scheduling=bool(config.async_scheduling),
        seed=config.seed,
        enable_kv_cache_events=config.kv_events_config is not None and config.kv_events_config.enable_kv_cache_events))


def step_time_fn(config: VllmServeConfig, spec: VllmEngineSpec) -> Callable[[StepBatch], float]:
    """Seconds one step takes on this model, GPU and layout (the perf model)."""
    link = catalogue_of(config.catalogue).link(spec.layout.link)
    dtype_bytes = dtype_bytes_of(config)
    kv_bytes = kv_dtype_bytes_of(config)
    offload_s = offload_step_s(config, spec)
    adapters = lora_step_cost(config, spec.model, spec.layout)

    def seconds(batch: StepBatch) -> float:
        return step_time.step_time_s(spec.model, spec.gpu, batch, spec.layout, link, dtype_bytes,
                                     kv_dtype_bytes=kv_bytes, lora=adapters) + offload_s

    return seconds


OFFLOAD_LINK = "pcie4"
"""Catalogue link --cpu-offload-gb weights cross every step (vLLM reads them through UVA)."""


def offload_step_s(config: VllmServeConfig, spec: VllmEngineSpec) -> float:
    """Seconds each step spends reading the --cpu-offload-gb weights from host memory."""
    if config.cpu_offload_gb <= 0:
        return 0.0
    link = catalogue_of(config.catalogue).link(OFFLOAD_LINK)
    return offloaded_bytes(config, spec.model, spec.layout) / link.bytes_s


def decode_run_time_fn(config: VllmServeConfig,
                       spec: VllmEngineSpec) -> Callable[[StepBatch, int, int], np.ndarray]:
    """Step times of a run of identical decode steps, vectorised (fake_engines.perf.step_time)."""
    link = catalogue_of(config.catalogue).link(spec.layout.link)
    run = functools.partial(step_time.decode_run_array_s, spec.model, spec.gpu, layout=spec.layout, link=link,
                            dtype_bytes=dtype_bytes_of(config), kv_dtype_bytes=kv_dtype_bytes_of(config),
                            lora=lora_step_cost(config, spec.model, spec.layout))
    offload_s = offload_step_s(config, spec)
    if not offload_s:
        return run
    return lambda first, step, n: run(first, step, n) + offload_s
