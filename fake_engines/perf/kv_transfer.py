"""KV-cache transfer between a prefill and a decode replica (disaggregated serving), modelled.

The decode engine pulls the prompt's KV blocks it does not hold from the prefill engine (vLLM's
NixlConnector reads them with RDMA, whole blocks at a time). The time is one fixed latency plus
the bytes over the link's per-direction bandwidth. Under tensor parallelism each GPU pulls its
own shard of the KV heads over its own NIC (one rail per GPU, as in NVIDIA's reference
designs), so the bytes that count are one GPU's. Pure and clock-free: the look-alike engines and
the simulator call the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

from fake_engines.perf.batch import Layout
from fake_engines.perf.catalogue import LinkSpec, ModelSpec
from fake_engines.perf.kv_cache import kv_bytes_per_token_per_gpu

KV_LINKS = ("nvlink", "ib400", "roce400", "pcie5", "pcie4", "eth100")
"""Catalogue links a KV transfer may cross (fake_engines/perf/catalogue.yaml has their figures
and sources); `--kv-link` names one. ib400 is the default: prefill and decode pools usually sit
on different nodes joined by InfiniBand NDR."""
DEFAULT_KV_LINK = "ib400"


@dataclass(frozen=True)
class KvTransfer:
    """One request's KV pull, as the capacity model sizes it."""

    num_blocks: int
    """KV blocks pulled (the prompt's blocks the decode engine did not hold)."""
    bytes_per_gpu: float
    """Bytes each GPU of the decode engine reads."""
    seconds: float
    """Modelled duration: link latency + bytes / bandwidth."""


def kv_block_bytes_per_gpu(model: ModelSpec, layout: Layout, kv_dtype_bytes: float, block_size: int) -> float:
    """Bytes of one KV block on one GPU: block_size tokens of this GPU's layers and KV heads."""
    return kv_bytes_per_token_per_gpu(model, layout, kv_dtype_bytes) * block_size


def kv_transfer(num_blocks: int, block_bytes_per_gpu: float, link: LinkSpec) -> KvTransfer:
    """The pull of `num_blocks` whole blocks over `link`; no blocks: no transfer, no time."""
    if num_blocks <= 0:
        return KvTransfer(0, 0.0, 0.0)
    size = num_blocks * block_bytes_per_gpu
    return KvTransfer(num_blocks, size, link.latency_s + size / link.bytes_s)


def blocks_to_pull(num_prompt_tokens: int, num_local_hit_tokens: int, block_size: int) -> int:
    """Blocks of the prompt beyond the decode engine's own prefix-cache hit (whole blocks; the
    last, partial one included, as NIXL reads block by block)."""
    total = -(-num_prompt_tokens // block_size)
    return max(0, total - num_local_hit_tokens // block_size)
