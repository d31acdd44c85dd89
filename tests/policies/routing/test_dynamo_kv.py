from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from policies.routing.kv_index import KVIndex
from tests.policies.routing.harness import views


def ids(n: int, start: int = 0) -> RequestInfo:
    return RequestInfo(prompt_token_ids=tuple(range(start, start + n)), prompt_tokens=n)


def test_defaults_are_dynamos():
    cfg = create_policy("dynamo-kv").config
    assert (cfg.overlap_score_weight, cfg.router_temperature) == (1.0, 0.0)


def test_cost_is_prefill_blocks_plus_decode_blocks():
    policy = create_policy("dynamo-kv")
    policy.select(views(2, in_flight_tokens=[16, 0]), ids(160))  # 10 blocks, all new: backend 1
    # Backend 1 holds 10 of the 12 blocks: cost 1 x 2 + (160/16 + 2) = 14; backend 0: 12 + (0 + 12) = 24.
    d = policy.select(views(2, in_flight_tokens=[0, 160]), ids(192))
    assert (d.index, d.rule, d.predicted_cached_tokens) == (1, "prefix-match", 160)
    # With 200 blocks in hand there, recomputing elsewhere is cheaper: 24 < 2 + 200 + 2.
    d = policy.select(views(2, in_flight_tokens=[0, 3200]), ids(192))
    assert (d.index, d.rule) == (0, "least-load")


def test_overlap_score_weight_scales_the_prefill_term():
    policy = create_policy("dynamo-kv:overlap_score_weight=0")
    policy.select(views(2, in_flight_tokens=[16, 0]), ids(160))
    d = policy.select(views(2, in_flight_tokens=[0, 48]), ids(192))  # 0 + 12 vs 3 + 2: cache still wins
    assert d.index == 1
    d = policy.select(views(2, in_flight_tokens=[0, 200]), ids(192))  # 12 vs 12.5 + 2
    assert d.index == 0


def test_equal_costs_go_to_the_smaller_tree_then_the_lower_index():
    policy = create_policy("dynamo-kv")
    policy.select(views(2), ids(64, start=1000))  # backend 0 learns 4 blocks of another prompt
    d = policy.select(views(2, in_flight_tokens=[0, 0]), ids(32))
    assert d.index == 1


def test_a_temperature_samples_from_the_softmax_of_costs():
    policy = create_policy("dynamo-kv:router_temperature=1.0")
    picks = {policy.select(views(3, in_flight_tokens=[0, 16, 32]), RequestInfo(prompt_token_ids=(i,) * 16,
                                                                              prompt_tokens=16)).index
             for i in range(40)}
    assert len(picks) > 1


def test_backends_that_publish_kv_events_are_matched_in_the_kv_index():
    index = KVIndex()
    policy = create_policy("dynamo-kv")
    policy.bind_kv_index(index)
    index.add_backend("http://replica-1")  # tracked, but holds nothing: never matched
    policy.select(views(2, in_flight_tokens=[16, 0]), ids(160))
    d = policy.select(views(2, in_flight_tokens=[16, 0]), ids(160))
    assert d.rule == "least-load"
