from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from tests.policies.routing.harness import views


def text(s: str) -> RequestInfo:
    return RequestInfo(prompt=s)


def test_defaults_are_aibrixs():
    cfg = create_policy("aibrix-prefix").config
    assert (cfg.block_size, cfg.block_number, cfg.imbalance_abs_count, cfg.standard_deviation_factor) == (
        4, 200_000, 8, 1)


def test_the_longest_match_wins_while_its_load_is_within_mean_plus_one_stddev():
    policy = create_policy("aibrix-prefix")
    first = policy.select(views(3, in_flight=[1, 1, 0]), text("abcdefgh" * 8))
    assert (first.index, first.rule) == (2, "least-load")
    d = policy.select(views(3, in_flight=[1, 0, 2]), text("abcdefgh" * 8 + "zzzz"))  # 2 <= mean 1 + stddev 1
    assert (d.index, d.rule) == (2, "prefix-match")


def test_a_match_on_a_backend_above_mean_plus_stddev_is_skipped():
    policy = create_policy("aibrix-prefix")
    policy.select(views(3, in_flight=[1, 1, 0]), text("abcdefgh" * 8))
    d = policy.select(views(3, in_flight=[0, 0, 3]), text("abcdefgh" * 8))  # 3 > 1 + 1.73
    assert d.rule == "least-load" and d.index in (0, 1)


def test_imbalance_beyond_eight_requests_restricts_matching_to_the_least_loaded():
    policy = create_policy("aibrix-prefix")
    policy.select(views(2, in_flight=[1, 0]), text("q" * 40))  # on backend 1
    assert policy.select(views(2, in_flight=[0, 8]), text("q" * 40)).index == 1  # 8 is not > 8
    d = policy.select(views(2, in_flight=[0, 9]), text("q" * 40))
    assert (d.index, d.rule) == (0, "least-load")


def test_a_short_tail_below_one_block_is_not_hashed():
    policy = create_policy("aibrix-prefix")
    policy.select(views(2, in_flight=[1, 0]), text("abc"))
    assert policy.select(views(2, in_flight=[0, 1]), text("abc")).index == 0
