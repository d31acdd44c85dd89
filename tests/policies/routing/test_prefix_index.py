from __future__ import annotations

import random
from collections import OrderedDict
from itertools import takewhile

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


class FlatLRU:
    """The reference: one OrderedDict of blocks per backend, every block moved on each insert."""

    def __init__(self) -> None:
        self.held: OrderedDict[int, None] = OrderedDict()

    def match(self, hashes: list[int]) -> int:
        return len(list(takewhile(self.held.__contains__, hashes)))

    def insert(self, hashes: list[int], capacity: int) -> None:
        for h in reversed(hashes):  # deepest first: the first block ends up the most recent
            self.held[h] = None
            self.held.move_to_end(h)
        while len(self.held) > capacity:
            self.held.popitem(last=False)


def test_radix_tree_holds_the_same_blocks_as_a_flat_lru_under_eviction():
    rng = random.Random(7)
    for capacity in (1, 5, 20, 60):
        index, flat = PrefixIndex(), FlatLRU()
        stems = ["".join(rng.choice("ab") for _ in range(64 * rng.randint(0, 6))) for _ in range(8)]
        for _ in range(400):  # prompts sharing prefixes of several lengths, in an LRU that keeps evicting
            prompt = rng.choice(stems) + "".join(rng.choice("abc") for _ in range(64 * rng.randint(0, 8)))
            hashes = block_hashes(RequestInfo(prompt=prompt), SHAPE)
            assert index.match("u", hashes) == flat.match(hashes)
            index.insert("u", hashes, capacity_blocks=capacity)
            flat.insert(hashes, capacity)
            assert index.size("u") == len(flat.held)
            probes = [block_hashes(RequestInfo(prompt=stem + "c" * 128), SHAPE) for stem in stems]
            assert [index.match("u", p) for p in probes] == [flat.match(p) for p in probes]


def test_a_touched_prompt_outlives_older_ones_whatever_its_length():
    index = PrefixIndex()
    long_chain, other = list(range(100, 110)), [1, 2, 3]
    index.insert("u", long_chain, capacity_blocks=13)
    index.insert("u", other, capacity_blocks=13)
    index.insert("u", long_chain, capacity_blocks=13)  # touched again: now the more recent
    index.insert("u", [50], capacity_blocks=13)  # one over: the tail of the older prompt goes
    assert (index.match("u", long_chain), index.match("u", other), index.match("u", [50])) == (10, 2, 1)
    assert index.match("u", (100, 101, 102)) == 3  # a tuple of hashes matches as a list does
