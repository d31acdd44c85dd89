from fake_engines.core import EngineRequest, RequestStatus
from fake_engines.core._kv_cache_manager import KVCacheManager


def _req(request_id: str, tokens: list[int], lora: str | None = None) -> EngineRequest:
    return EngineRequest(request_id, tokens, max_tokens=4, output_len=4, lora=lora)


def _admit(kv: KVCacheManager, request: EngineRequest) -> int:
    hits, num_hit = kv.get_computed_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - num_hit, hits) is not None
    kv.record_prefix_cache_stats(request, num_hit)
    request.num_computed_tokens = num_hit
    return num_hit


def test_shared_prefix_reuses_full_blocks_only():
    kv = KVCacheManager(num_gpu_blocks=11, block_size=4, enable_caching=True)
    a = _req("a", list(range(10)))
    assert _admit(kv, a) == 0
    assert kv.get_block_ids("a") == [1, 2, 3]
    b = _req("b", list(range(8)) + [99, 98, 97])
    assert _admit(kv, b) == 8
    assert kv.get_block_ids("b") == [1, 2, 4]
    assert kv.usage == 0.4
    assert (kv.prefix_cache_stats.queries, kv.prefix_cache_stats.hits) == (21, 8)


def test_fully_cached_prompt_still_recomputes_its_last_block():
    kv = KVCacheManager(num_gpu_blocks=11, block_size=4, enable_caching=True)
    _admit(kv, _req("a", list(range(8))))
    assert _admit(kv, _req("b", list(range(8)))) == 4


def test_same_tokens_under_another_adapter_do_not_share_blocks():
    kv = KVCacheManager(num_gpu_blocks=11, block_size=4, enable_caching=True)
    _admit(kv, _req("a", list(range(12)), lora="sql"))
    assert _admit(kv, _req("b", list(range(12)), lora="chat")) == 0
    assert _admit(kv, _req("c", list(range(12)), lora="sql")) == 8


def test_freed_blocks_stay_cached_until_evicted_lru_first():
    kv = KVCacheManager(num_gpu_blocks=5, block_size=4, enable_caching=True)
    a = _req("a", list(range(9)))
    _admit(kv, a)
    a.status = RequestStatus.FINISHED_STOPPED
    kv.free(a)
    assert kv.usage == 0.0
    # a's partial tail (block 3, no hash) goes to the front to be reused first, as in vLLM;
    # its full blocks join the back, tail first
    assert kv.block_pool.free_block_queue.block_ids() == [3, 4, 2, 1]
    _admit(kv, _req("x", [50, 51]))
    assert _admit(kv, _req("a2", list(range(9)))) == 8
    assert kv.get_block_ids("a2") == [1, 2, 4]


def test_eviction_takes_the_tail_of_a_freed_sequence_before_its_head():
    kv = KVCacheManager(num_gpu_blocks=5, block_size=4, enable_caching=True)
    a = _req("a", list(range(9)))
    _admit(kv, a)
    a.status = RequestStatus.FINISHED_STOPPED
    kv.free(a)
    _admit(kv, _req("x", list(range(100, 109))))
    assert kv.get_block_ids("x") == [3, 4, 2]
    hits, num_hit_tokens = kv.get_computed_blocks(_req("a2", list(range(9))))
    assert ([b.block_id for b in hits], num_hit_tokens) == ([1], 4)


def test_a_lookup_that_is_not_admitted_is_not_counted():
    kv = KVCacheManager(num_gpu_blocks=11, block_size=4, enable_caching=True)
    _admit(kv, _req("a", list(range(10))))
    kv.get_computed_blocks(_req("b", list(range(10))))  # looked up, left waiting
    assert (kv.prefix_cache_stats.queries, kv.prefix_cache_stats.hits) == (10, 0)


def test_admission_with_full_sequence_must_fit_needs_room_for_the_whole_input():
    kv = KVCacheManager(num_gpu_blocks=5, block_size=4, enable_caching=True)
    a = _req("a", list(range(16)))
    assert kv.allocate_slots(a, 4, None, full_sequence_tokens=17) is None
    assert kv.get_block_ids("a") == []
    assert kv.allocate_slots(a, 4, None, full_sequence_tokens=16) is not None
    assert kv.get_block_ids("a") == [1]


def test_allocation_that_does_not_fit_returns_none_and_changes_nothing():
    kv = KVCacheManager(num_gpu_blocks=4, block_size=4, enable_caching=True)
    _admit(kv, _req("a", list(range(8))))
    before = kv.block_pool.free_block_queue.block_ids()
    assert kv.allocate_slots(_req("b", list(range(100, 108))), 8) is None
    assert kv.block_pool.free_block_queue.block_ids() == before
    assert kv.get_block_ids("b") == []


def test_no_lookup_and_no_stats_when_prefix_caching_is_off():
    kv = KVCacheManager(num_gpu_blocks=11, block_size=4, enable_caching=False)
    _admit(kv, _req("a", list(range(8))))
    assert _admit(kv, _req("b", list(range(8)))) == 0
    assert (kv.prefix_cache_stats.queries, kv.prefix_cache_stats.hits) == (0, 0)
