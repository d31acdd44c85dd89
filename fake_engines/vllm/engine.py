"""From `fake-vllm serve` flags to a sized engine: model, GPU, KV blocks, step time, cold start.

The arithmetic lives in fake_engines.perf; this module only wires flags to it and words the
refusals as vLLM does when a model does not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath

from fake_engines.core import VllmScheduler, VllmSchedulerConfig
from fake_engines.perf import coldstart, kv_cache, lora, step_time
from fake_engines.perf.batch import Layout, StepBatch
from fake_engines.perf.catalogue import CatalogueError, GpuSpec, ModelSpec, load_catalogue, model_from_shape
from fake_engines.vllm.config import ServeConfigError, VllmServeConfig, default_batch_limits

GIB = 2**30


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


def resolve_model(name: str) -> ModelSpec:
    """A catalogue model by name, or by the last part of a path (/models/llama-3.1-8b)."""
    catalogue = load_catalogue()
    for candidate in (name, PurePath(name).name, PurePath(name).name.lower()):
        try:
            return catalogue.model(candidate)
        except (CatalogueError, KeyError):
            continue
    raise ServeConfigError(f"model {name!r} is not in the catalogue ({', '.join(sorted(catalogue.models))})")


def model_of(config: VllmServeConfig) -> ModelSpec:
    """The explicit shape when given, else the catalogue entry MODEL names."""
    if config.model_shape is None:
        return resolve_model(config.model)
    shape = {k: v for k, v in config.model_shape.items() if v is not None}
    fixed = {k: shape.pop(k) for k in ("params", "layers", "kv_heads")}
    return model_from_shape(fixed["params"], int(fixed["layers"]), int(fixed["kv_heads"]),
                            int(shape.pop("head_dim", 128)), name=config.model, **{k: int(v) for k, v in shape.items()})


def size_engine(config: VllmServeConfig) -> VllmEngineSpec:
    """Size the engine for the flags, or raise ModelDoesNotFit in vLLM's words."""
    model = model_of(config)
    gpu = load_catalogue().gpu(config.gpu)
    layout = Layout(tp=config.tensor_parallel_size, pp=config.pipeline_parallel_size,
                    dp=config.data_parallel_size, ep=config.enable_expert_parallel)
    dtype_bytes = dtype_bytes_of(config)
    weights = kv_cache.weight_bytes_per_gpu(model, layout, dtype_bytes)
    _check_weights_fit(weights, gpu)
    block_bytes = kv_cache.kv_bytes_per_token_per_gpu(model, layout, dtype_bytes) * config.resolved_block_size
    blocks = config.num_gpu_blocks_override or _capacity_blocks(config, model, gpu, layout, dtype_bytes)
    _check_max_model_len(config, blocks, block_bytes)
    tokens, seqs = default_batch_limits(gpu.memory_gb, gpu.name)
    load = coldstart.cold_start_s(weights, config.load_gbps, config.startup_s, config.warmup_s)
    return VllmEngineSpec(model=model, gpu=gpu, layout=layout, num_gpu_blocks=blocks,
                          kv_cache_memory_bytes=int(blocks * block_bytes),
                          max_num_seqs=config.max_num_seqs or seqs,
                          max_num_batched_tokens=config.max_num_batched_tokens or tokens, cold_start_s=load)


def dtype_bytes_of(config: VllmServeConfig) -> int:
    """Bytes per weight (and KV element) for --dtype."""
    return max(1, round(config.weight_bits / 8))


def lora_reserve_bytes(config: VllmServeConfig, model: ModelSpec, layout: Layout) -> float:
    """GPU memory vLLM sets aside for --max-loras adapters at --max-lora-rank (0 without --enable-lora)."""
    if not config.enable_lora or not (model.hidden and model.heads and model.intermediate):
        return 0.0
    modules = lora.llama_modules(model.hidden, model.intermediate, model.heads, model.kv_heads, model.head_dim,
                                 experts=model.experts)
    shape = lora.LoraShape(modules, max(1, model.layers // layout.pp))
    return lora.vllm_adapter_buffer_bytes_per_gpu(shape, config.max_loras, config.max_lora_rank, layout.tp)


def _capacity_blocks(config: VllmServeConfig, model: ModelSpec, gpu: GpuSpec, layout: Layout,
                     dtype_bytes: int) -> int:
    reserve_gb = kv_cache.ACTIVATION_RESERVE_GB + lora_reserve_bytes(config, model, layout) / 1e9
    try:
        return kv_cache.kv_cache_blocks(model, gpu, layout, config.gpu_memory_utilization,
                                        config.resolved_block_size, dtype_bytes, reserve_gb)
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


def _check_max_model_len(config: VllmServeConfig, blocks: int, block_bytes: float) -> None:
    capacity_tokens = blocks * config.resolved_block_size
    if capacity_tokens >= config.max_model_len:
        return
    needed = config.max_model_len / config.resolved_block_size * block_bytes / GIB
    available = blocks * block_bytes / GIB
    raise ModelDoesNotFit(
        f"ValueError: To serve at least one request with the models's max seq len ({config.max_model_len}), "
        f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({available:.2f} GiB). Based on the available memory, the estimated maximum model length is "
        f"{capacity_tokens}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.")


def build_scheduler(config: VllmServeConfig, spec: VllmEngineSpec) -> VllmScheduler:
    """The clock-free vLLM core for these flags."""
    return VllmScheduler(VllmSchedulerConfig(
        num_gpu_blocks=spec.num_gpu_blocks, max_model_len=config.max_model_len, max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens, block_size=config.resolved_block_size,
        enable_prefix_caching=config.enable_prefix_caching,
        prefix_caching_hash_algo=config.prefix_caching_hash_algo, max_loras=config.max_loras,
        max_concurrent_batches=config.pipeline_parallel_size, seed=config.seed))


def step_time_fn(config: VllmServeConfig, spec: VllmEngineSpec) -> Callable[[StepBatch], float]:
    """Seconds one step takes on this model, GPU and layout (the perf model)."""
    link = load_catalogue().link(spec.layout.link)
    dtype_bytes = dtype_bytes_of(config)

    def seconds(batch: StepBatch) -> float:
        return step_time.step_time_s(spec.model, spec.gpu, batch, spec.layout, link, dtype_bytes)

    return seconds


def cache_config_labels(config: VllmServeConfig, spec: VllmEngineSpec) -> dict[str, str]:
    """vllm:cache_config_info labels: CacheConfig's fields as strings, as vLLM 0.32 lists them."""
    block = config.resolved_block_size
    tokens = spec.num_gpu_blocks * block
    return {
        "_block_size_resolved": "True", "block_size": str(block), "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None", "effective_attention_block_size": str(block),
        "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": str(config.enable_prefix_caching),
        "gpu_memory_utilization": str(config.gpu_memory_utilization), "hash_block_size": "None",
        "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(tokens / config.max_model_len),
        "kv_cache_memory_bytes": str(spec.kv_cache_memory_bytes), "kv_cache_size_tokens": str(tokens),
        "kv_offloading_backend": "native", "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "float32", "num_cpu_blocks": "None",
        "num_gpu_blocks": str(spec.num_gpu_blocks), "num_gpu_blocks_override": str(config.num_gpu_blocks_override),
        "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": config.prefix_caching_hash_algo, "prefix_match_unit": "None",
        "replayssm_buffer_len": "16", "skip_page_size_padded": "None", "sliding_window": "None",
        "swa_bounded_replay": "True", "use_kda_recoverssm": "False", "use_replayssm": "False",
        "user_specified_block_size": str(config.block_size is not None),
    }
