from __future__ import annotations

import msgspec

from policies.routing import RequestInfo, create_policy
from policies.routing.llm_d import llm_d_hashes
from tests.policies.routing.harness import views

PROMPT = RequestInfo(prompt="p" * 640)  # ten 64-character blocks


def test_defaults_are_llm_ds_scorer_weights():
    cfg = create_policy("llm-d").config
    assert (cfg.queue_weight, cfg.kv_cache_weight, cfg.prefix_weight, cfg.max_prefix_blocks) == (2.0, 2.0, 3.0, 256)


def test_the_weighted_sum_of_queue_kv_and_prefix_scores_decides():
    policy = create_policy("llm-d")
    first = policy.select(views(3, num_requests_waiting=[4, 0, 2], kv_cache_usage=[0.0, 0.5, 0.0]), PROMPT)
    # queue scores 0, 1, 0.5 and kv scores 1, 0.5, 1: 2 + 0, 2 + 1, 1 + 2 -> backend 0 loses, 1 and 2 tie at 3
    assert first.index in (1, 2) and first.rule == "least-load"
    # The prefix (3 x 1.0) outweighs a full queue score (2 x 1.0) and half the KV score.
    backends = views(3, num_requests_waiting=[0, 0, 0], kv_cache_usage=[0.0, 0.0, 0.0])
    busy = [msgspec.structs.replace(b, num_requests_waiting=5) if b.index == first.index else b for b in backends]
    again = policy.select(busy, PROMPT)
    assert (again.index, again.rule) == (first.index, "prefix-match")


def test_a_kv_cache_full_backend_loses_to_an_equal_empty_one():
    policy = create_policy("llm-d")
    d = policy.select(views(2, num_requests_waiting=[1, 1], kv_cache_usage=[0.9, 0.1]), PROMPT)
    assert d.index == 1


def test_the_prefix_score_is_the_share_of_blocks_held():
    policy = create_policy("llm-d")
    policy.select(views(2, num_requests_waiting=[5, 0]), RequestInfo(prompt="a" * 320))  # 5 blocks on 1
    scores = policy.scores(views(2), llm_d_hashes(RequestInfo(prompt="a" * 320 + "b" * 320), policy.config))
    assert [p for _, p in scores] == [0.0, 0.5]


def test_ties_are_broken_by_the_seeded_rng_not_always_the_first():
    policy = create_policy("llm-d")
    picks = {policy.select(views(4), RequestInfo(prompt=f"{i:02d}" * 40)).index for i in range(20)}
    assert len(picks) > 1
