import os
import subprocess
import sys

import pytest

from fake_engines.core._block_pool import (
    BUILTIN_NONE_HASH,
    NONE_HASH,
    BlockPool,
    hash_block_chain,
    hash_block_tokens,
)
from tests.conftest import REPO


def test_block_zero_is_reserved_and_blocks_come_from_the_lru_end():
    pool = BlockPool(num_gpu_blocks=11, enable_caching=True)
    assert pool.free_block_queue.block_ids() == list(range(1, 11))
    assert [b.block_id for b in pool.get_new_blocks(3)] == [1, 2, 3]
    assert pool.get_num_free_blocks() == 7


def test_freed_cached_blocks_join_the_mru_end_in_the_order_given():
    pool = BlockPool(num_gpu_blocks=11, enable_caching=True)
    a = pool.get_new_blocks(3)
    b = pool.get_new_blocks(2)
    pool.cache_full_blocks(a + b, [b"a0", b"a1", b"a2", b"b0", b"b1"])
    pool.free_blocks(list(reversed(b)))
    pool.free_blocks(list(reversed(a)))
    assert pool.free_block_queue.block_ids() == [6, 7, 8, 9, 10, 5, 4, 3, 2, 1]


def test_freed_blocks_without_a_hash_go_to_the_front_to_be_reused_first():
    # vLLM's BlockPool.free_blocks: a partial tail never matches the prefix cache, so it is
    # reused before any cached block is evicted
    pool = BlockPool(num_gpu_blocks=11, enable_caching=True)
    a = pool.get_new_blocks(3)
    pool.cache_full_blocks(a[:2], [b"a0", b"a1"])
    pool.free_blocks(list(reversed(a)))
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 6, 7, 8, 9, 10, 2, 1]
    (taken,) = pool.get_new_blocks(1)
    assert taken is a[2] and pool.get_cached_block(b"a0") is a[0]


def test_without_prefix_caching_freed_blocks_are_reused_last_in_first_out():
    pool = BlockPool(num_gpu_blocks=6, enable_caching=False)
    a = pool.get_new_blocks(2)
    pool.free_blocks(list(reversed(a)))
    assert pool.free_block_queue.block_ids() == [2, 1, 3, 4, 5]


def test_a_duplicate_copy_stays_findable_after_the_first_is_evicted():
    # vLLM does not de-duplicate cached blocks: two requests computing the same prefix in one
    # step cache it twice, and evicting one copy leaves the other hittable
    pool = BlockPool(num_gpu_blocks=3, enable_caching=True)
    first, second = pool.get_new_blocks(2)
    pool.cache_full_block(first, b"same")
    pool.cache_full_block(second, b"same")
    assert pool.get_cached_block(b"same") is first
    pool.free_blocks([first, second])
    assert pool.get_new_blocks(1) == [first]
    assert pool.get_cached_block(b"same") is second
    assert pool.get_new_blocks(1) == [second]
    assert pool.get_cached_block(b"same") is None


def test_usage_counts_referenced_blocks_only():
    pool = BlockPool(num_gpu_blocks=11, enable_caching=True)
    blocks = pool.get_new_blocks(4)
    assert pool.get_usage() == 0.4
    pool.cache_full_block(blocks[0], b"h0")
    pool.free_blocks(blocks)
    assert pool.get_usage() == 0.0
    assert pool.get_cached_block(b"h0") is blocks[0]


def test_taking_a_cached_free_block_evicts_its_hash():
    pool = BlockPool(num_gpu_blocks=3, enable_caching=True)
    first, second = pool.get_new_blocks(2)
    pool.cache_full_block(first, b"h-first")
    pool.cache_full_block(second, b"h-second")
    pool.free_blocks([second, first])
    (taken,) = pool.get_new_blocks(1)
    assert taken is second and taken.block_hash is None
    assert pool.get_cached_block(b"h-second") is None
    assert pool.get_cached_block(b"h-first") is first


def test_touch_takes_a_cache_hit_out_of_the_free_queue():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(blocks)
    pool.touch([blocks[1]])
    assert blocks[1].ref_cnt == 1
    assert pool.free_block_queue.block_ids() == [1, 3]


def test_asking_for_more_blocks_than_free_is_a_broken_invariant():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    try:
        pool.get_new_blocks(4)
    except ValueError as err:
        assert "4 free blocks" in str(err)
    else:
        raise AssertionError("expected ValueError")


def test_block_hash_chains_on_parent_and_includes_the_adapter():
    h0 = hash_block_tokens(None, (1, 2, 3, 4), None)
    assert h0 == hash_block_tokens(NONE_HASH, (1, 2, 3, 4), None)
    assert h0 != hash_block_tokens(None, (1, 2, 3, 4), "lora-a")
    assert hash_block_tokens(h0, (5, 6, 7, 8), None) != hash_block_tokens(None, (5, 6, 7, 8), None)
    assert len(h0) == 32


@pytest.mark.parametrize("block_size", [1, 2, 16])
@pytest.mark.parametrize("lora", [None, "sql-lora", "it's"])
def test_chain_of_block_hashes_equals_hashing_block_by_block(block_size: int, lora: str | None) -> None:
    tokens = [(i * 7919) % 100_003 for i in range(5 * block_size + block_size // 2)]
    expected, parent = [], None
    for start in range(0, 5 * block_size, block_size):
        parent = hash_block_tokens(parent, tuple(tokens[start:start + block_size]), lora)
        expected.append(parent)
    assert hash_block_chain(None, tokens, block_size, lora) == expected
    assert hash_block_chain(expected[1], tokens[2 * block_size:], block_size, lora) == expected[2:]


def test_builtin_chain_is_vllms_tuple_hash_of_parent_block_and_adapter() -> None:
    tokens = [(i * 7919) % 100_003 for i in range(40)]
    chain = hash_block_chain(None, tokens, 16, None, algo="builtin")
    assert chain == [hash((BUILTIN_NONE_HASH, tuple(tokens[:16]), None)),
                     hash((chain[0], tuple(tokens[16:32]), None))]
    assert hash_block_chain(chain[0], tokens[16:], 16, None, "builtin") == chain[1:]
    with_adapter = hash_block_chain(None, tokens, 16, "sql-lora", "builtin")
    assert len(with_adapter) == 2 and not set(with_adapter) & set(chain)


def test_builtin_chain_is_the_same_under_every_pythonhashseed() -> None:
    # str hashes change with PYTHONHASHSEED; the adapter enters the key as an int made from its name
    code = ("from fake_engines.core._block_pool import hash_block_chain; "
            "print(hash_block_chain(None, list(range(64)), 16, 'sql-lora', 'builtin'))")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outputs) == 1 and outputs.pop().startswith("[")
