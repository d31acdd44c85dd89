from __future__ import annotations

import pytest

from fake_engines.perf.batch import Layout
from fake_engines.perf.catalogue import load_catalogue
from fake_engines.perf.kv_cache import (
    KvCacheMemoryError,
    kv_bytes_per_token_per_gpu,
    kv_cache_blocks,
    weight_bytes_per_gpu,
)

CAT = load_catalogue()
H100 = CAT.gpu("h100")


def test_blocks_are_what_is_left_after_weights_and_activations():
    m = CAT.model("llama-3.1-8b")
    free = 80e9 * 0.9 - 8.03e9 * 2 - 2e9
    assert kv_cache_blocks(m, H100) == int(free // (16 * 128 * 1024))


def test_tensor_parallel_splits_weights_and_kv_heads_until_one_head_per_gpu():
    m = CAT.model("llama-3.1-70b")
    assert weight_bytes_per_gpu(m, Layout(tp=4)) == pytest.approx(141.2e9 / 4)
    assert kv_bytes_per_token_per_gpu(m, Layout(tp=4)) == 320 * 1024 / 4
    assert kv_bytes_per_token_per_gpu(m, Layout(tp=16)) == 320 * 1024 / 8


def test_weights_too_large_refuse_with_vllms_message():
    with pytest.raises(KvCacheMemoryError, match=r"No available memory for the cache blocks\. Try increasing "
                                                 r"`gpu_memory_utilization`"):
        kv_cache_blocks(CAT.model("llama-3.1-70b"), H100)


def test_lower_utilization_gives_fewer_blocks_and_bad_values_name_the_field():
    m = CAT.model("llama-3.1-8b")
    assert kv_cache_blocks(m, H100, gpu_memory_utilization=0.5) < kv_cache_blocks(m, H100)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_cache_blocks(m, H100, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="block_size"):
        kv_cache_blocks(m, H100, block_size=0)


def test_expert_parallel_spreads_experts_over_the_group():
    m = CAT.model("mixtral-8x7b")
    assert weight_bytes_per_gpu(m, Layout(tp=2, dp=4, ep=True)) < weight_bytes_per_gpu(m, Layout(tp=2))
