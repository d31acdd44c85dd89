from __future__ import annotations

from policies.routing.hash_ring import HashRing, stable_hash


def test_stable_hash_is_pinned_so_placements_survive_restarts():
    # blake2b with an 8-byte digest of b"flotilla", read big-endian; Python's hash() would vary.
    assert stable_hash("flotilla") == 3151344270384692562
    assert stable_hash(b"flotilla") == stable_hash("flotilla")


def test_walk_visits_every_backend_once_starting_at_home():
    ring = HashRing(["http://a", "http://b", "http://c"], vnodes=16)
    walk = ring.walk("key-1")
    assert sorted(walk) == ["http://a", "http://b", "http://c"]
    assert ring.walk("key-1") == walk
    assert HashRing([]).walk("x") == []


def test_keys_spread_over_backends_with_enough_virtual_nodes():
    ring = HashRing([f"http://r{i}" for i in range(4)], vnodes=160)
    counts: dict[str, int] = {}
    for i in range(4000):
        home = ring.walk(f"k{i}")[0]
        counts[home] = counts.get(home, 0) + 1
    assert max(counts.values()) / min(counts.values()) < 1.5
