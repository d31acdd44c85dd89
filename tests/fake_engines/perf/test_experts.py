from __future__ import annotations

import pytest

from fake_engines.perf.experts import (
    all_to_all_bytes,
    balanced_placement,
    contiguous_placement,
    explicit_placement,
    remote_copies,
)
from fake_engines.perf.rounding import fixed

LOADS = [16, 18, 4, 4, 6, 4, 5, 7]  # tokens per expert in Example 8
COPIES = [[7, 2, 3, 4], [9, 3, 2, 2], [8, 2, 2, 4], [10, 1, 3, 2]]


def test_example_8_contiguous_placement_work_and_imbalance():
    p = contiguous_placement(LOADS, devices=4)
    assert p.work == [34, 8, 10, 12]
    assert (p.max_work, fixed(p.mean_work, 0), fixed(p.imbalance, 2)) == (34, "16", "2.13")


def test_example_8_spread_placement_and_all_to_all_bytes():
    p = explicit_placement([[0, 7], [1, 6], [2, 5], [3, 4]], LOADS)
    assert p.work == [23, 23, 8, 10]
    assert [sum(row) for row in COPIES] == [16, 16, 16, 16]
    remote = remote_copies(COPIES)
    assert (remote, sum(map(sum, COPIES))) == (50, 64)
    assert all_to_all_bytes(remote, hidden=4096) / 1024 == 800


def test_better_placement_cannot_beat_the_hottest_expert_without_replicas():
    p = balanced_placement(LOADS, devices=4)
    assert p.max_work < 34
    assert p.max_work >= max(LOADS)
    assert sorted(e for held in p.experts for e in held) == list(range(8))


def test_replicas_of_hot_experts_break_the_single_expert_floor():
    p = balanced_placement(LOADS, devices=4, redundant=4)
    assert all(len(held) == 3 for held in p.experts)
    assert p.max_work < max(LOADS)
    assert sum(p.work) == pytest.approx(sum(LOADS))


def test_uneven_expert_count_is_refused_with_the_counts():
    with pytest.raises(ValueError, match=r"experts \+ redundant \(9\)"):
        balanced_placement(LOADS, devices=4, redundant=1)
