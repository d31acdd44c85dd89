from __future__ import annotations

from policies.routing import RequestInfo
from policies.routing.prefix_index import BlockShape, PrefixIndex, block_hashes

SHAPE = BlockShape(block_size_tokens=16, chars_per_token=4)  # 64-character blocks


def test_only_full_blocks_are_hashed_and_shared_prefixes_share_hashes():
    a = block_hashes(RequestInfo(prompt="s" * 64 + "a" * 70), SHAPE)
    b = block_hashes(RequestInfo(prompt="s" * 64 + "b" * 64), SHAPE)
    assert len(a) == 2 and len(b) == 2
    assert a[0] == b[0] and a[1] != b[1]
    assert block_hashes(RequestInfo(prompt="s" * 63), SHAPE) == []


def test_hash_chain_depends_on_every_earlier_block_and_the_model():
    a = block_hashes(RequestInfo(prompt="x" * 64 + "y" * 64), SHAPE)
    b = block_hashes(RequestInfo(prompt="z" * 64 + "y" * 64), SHAPE)
    assert a[1] != b[1]
    other_model = block_hashes(RequestInfo(prompt="x" * 64 + "y" * 64, model="m2"), SHAPE)
    assert set(a).isdisjoint(other_model)


def test_token_ids_are_preferred_over_text():
    tokens = tuple(range(40))
    with_ids = block_hashes(RequestInfo(prompt="q" * 640, prompt_token_ids=tokens), SHAPE)
    assert len(with_ids) == 2
    assert with_ids == block_hashes(RequestInfo(prompt_token_ids=tokens[:32]), SHAPE)


def test_lru_evicts_the_deepest_blocks_of_the_oldest_prompt_first():
    index = PrefixIndex()
    index.insert("u", [1, 2, 3], capacity_blocks=4)  # LRU order 3, 2, 1
    index.insert("u", [7, 8], capacity_blocks=4)  # 3, 2, 1, 8, 7: block 3 goes
    assert index.match("u", [1, 2, 3]) == 2
    assert index.match("u", [7, 8]) == 2
    assert index.size("u") == 4
    index.insert("u", [1, 5], capacity_blocks=4)  # 2, 8, 7, 5, 1: block 2 goes
    assert index.match("u", [1, 2, 3]) == 1
    assert index.match("u", [7, 8]) == 2
    assert index.match("u", [1, 5]) == 2
    assert index.match("other", [1]) == 0


def test_record_sizes_each_backend_lru_from_its_scraped_kv_capacity():
    from policies.routing.base import BackendView

    index = PrefixIndex(default_capacity_blocks=100)
    small = BackendView(index=0, url="small", cache_capacity_tokens=2 * 16)  # room for 2 blocks of 16 tokens
    unknown = BackendView(index=1, url="unknown")
    index.record(small, [1, 2, 3], block_size_tokens=16)
    index.record(unknown, [1, 2, 3], block_size_tokens=16)
    assert (index.size("small"), index.size("unknown")) == (2, 3)
    assert index.match_fraction("unknown", [1, 2, 3, 4]) == 0.75
    assert index.match_fraction("small", []) == 0.0


def test_bisected_match_and_shortcut_insert_agree_with_a_linear_scan_under_eviction():
    import random
    from itertools import takewhile

    rng = random.Random(7)
    fast, plain = PrefixIndex(), PrefixIndex()
    stems = ["".join(rng.choice("ab") for _ in range(64 * rng.randint(0, 6))) for _ in range(8)]
    for _ in range(400):  # prompts sharing prefixes of several lengths, in an LRU that keeps evicting
        prompt = rng.choice(stems) + "".join(rng.choice("abc") for _ in range(64 * rng.randint(0, 8)))
        hashes = block_hashes(RequestInfo(prompt=prompt), SHAPE)
        linear = len(list(takewhile(fast._lru.get("u", {}).__contains__, hashes)))
        assert fast.match("u", hashes) == linear
        fast.insert("u", hashes, capacity_blocks=20, held_blocks=linear)
        plain.insert("u", hashes, capacity_blocks=20)
        assert list(fast._lru["u"]) == list(plain._lru["u"])  # the same blocks in the same LRU order
