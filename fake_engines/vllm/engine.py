"""The sized vLLM engine as the HTTP surface sees it. Sizing from flags lives below the surface,
in the engine factory (fake_engines/factory/vllm_engine.py), re-exported here; what stays is
how the sized engine shows in vllm:cache_config_info."""

from __future__ import annotations

from fake_engines.factory.vllm_engine import (
    GIB,
    ModelDoesNotFit,
    VllmEngineSpec,
    build_scheduler,
    dtype_bytes_of,
    lora_reserve_bytes,
    model_of,
    resolve_model,
    resolved_config,
    size_engine,
    step_time_fn,
)
from fake_engines.vllm.config import VllmServeConfig

__all__ = ["GIB", "ModelDoesNotFit", "VllmEngineSpec", "build_scheduler", "cache_config_labels", "dtype_bytes_of",
           "lora_reserve_bytes", "model_of", "resolve_model", "resolved_config", "size_engine", "step_time_fn"]


def cache_config_labels(config: VllmServeConfig, spec: VllmEngineSpec) -> dict[str, str]:
    """vllm:cache_config_info labels: CacheConfig's fields as strings, as vLLM 0.32 lists them."""
    block = config.resolved_block_size
    tokens = spec.num_gpu_blocks * block
    return {
        "_block_size_resolved": "True", "block_size": str(block), "cache_dtype": config.kv_cache_dtype,
        "cache_hit_alignment_tokens": "None", "effective_attention_block_size": str(block),
        "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": str(config.enable_prefix_caching),
        "gpu_memory_utilization": str(config.gpu_memory_utilization), "hash_block_size": "None",
        "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(tokens / (spec.max_model_len or config.max_model_len or tokens)),
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
