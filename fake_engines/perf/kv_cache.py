"""KV-cache capacity of one GPU: what is left after the weights and the activation peak, in blocks."""

from __future__ import annotations

from fake_engines.perf.batch import Layout
from fake_engines.perf.catalogue import GpuSpec, ModelSpec

ONE_GPU = Layout()
"""The default layout: one GPU, no parallelism."""

ACTIVATION_RESERVE_GB = 2.0
"""Memory vLLM's profile run finds busy besides weights and KV: peak activations of a
max_num_batched_tokens pass, CUDA graphs and the non-torch allocations; ~2 GB for 7-8B models."""

NO_MEMORY_MESSAGE = ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                     "when initializing the engine.")
"""vLLM's wording (vllm/v1/core/kv_cache_utils.py) when nothing is left for the KV cache."""


class KvCacheMemoryError(ValueError):
    """The weights and activations leave no memory for a single KV block; the engine must not start."""


def weight_bytes_per_gpu(model: ModelSpec, layout: Layout = ONE_GPU, dtype_bytes: int = 2) -> float:
    """Weights one GPU holds: dense layers split over tp x pp, experts over the EP group when -ep."""
    expert = model.expert_params * dtype_bytes
    dense = model.weight_bytes(dtype_bytes * 8) - expert
    expert_group = layout.tp * layout.dp if layout.ep else layout.tp
    return dense / (layout.tp * layout.pp) + expert / (expert_group * layout.pp)


def kv_bytes_per_token_per_gpu(model: ModelSpec, layout: Layout = ONE_GPU, dtype_bytes: float = 2) -> float:
    """KV bytes one token takes on one GPU: its stage's layers, its share of the KV heads."""
    heads_share = 1.0
    if not model.kv_latent_dim and model.kv_heads > 0:
        heads_share = max(1.0, model.kv_heads / layout.tp) / model.kv_heads
    return model.kv_bytes_per_token(dtype_bytes) * heads_share / layout.pp


def kv_cache_blocks(model: ModelSpec, gpu: GpuSpec, layout: Layout = ONE_GPU,
                    gpu_memory_utilization: float = 0.9, block_size: int = 16, dtype_bytes: int = 2,
                    activation_reserve_gb: float = ACTIVATION_RESERVE_GB, kv_dtype_bytes: float | None = None) -> int:
    """KV blocks of ``block_size`` tokens that fit on each GPU of the engine; KV elements take
    ``kv_dtype_bytes`` (vLLM --kv-cache-dtype fp8: 1), else ``dtype_bytes`` as the weights.

    Raises KvCacheMemoryError, with vLLM's message, when no block fits.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    budget = gpu.memory_bytes * gpu_memory_utilization
    free = budget - weight_bytes_per_gpu(model, layout, dtype_bytes) - activation_reserve_gb * 1e9
    per_block = kv_bytes_per_token_per_gpu(model, layout, kv_dtype_bytes or dtype_bytes) * block_size
    blocks = int(free // per_block) if free > 0 else 0
    if blocks < 1:
        raise KvCacheMemoryError(NO_MEMORY_MESSAGE)
    return blocks
