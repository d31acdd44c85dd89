from __future__ import annotations

import pytest

from policies.routing import ConfigError, RequestInfo, create_policy
from policies.routing.radix_tree import RadixTree
from tests.policies.routing.harness import views


def text(prompt: str) -> RequestInfo:
    return RequestInfo(prompt=prompt)


def test_defaults_are_sglang_router_0_3_2s():
    cfg = create_policy("sglang-cache-aware").config
    assert (cfg.cache_threshold, cfg.balance_abs_threshold, cfg.balance_rel_threshold, cfg.max_tree_size) == (
        0.3, 64, 1.5, 2**26)


def test_balanced_load_follows_a_text_match_above_the_cache_threshold_whatever_the_load():
    policy = create_policy("sglang-cache-aware")
    first = policy.select(views(3, in_flight=[1, 1, 0]), text("You are a helpful assistant. Hello"))
    assert (first.index, first.rule) == (2, "least-load")
    # 29 of 34 characters (0.85) are in the tree, on backend 2, though it is now the busiest.
    again = policy.select(views(3, in_flight=[0, 0, 9]), text("You are a helpful assistant. Bye!!"))
    assert (again.index, again.rule) == (2, "prefix-match")


def test_a_match_at_or_below_the_cache_threshold_goes_to_the_least_loaded():
    policy = create_policy("sglang-cache-aware:cache_threshold=0.5")
    policy.select(views(2, in_flight=[1, 0]), text("aaaabbbb"))  # on backend 1
    d = policy.select(views(2, in_flight=[1, 2]), text("aaaacccc"))  # 4 of 8 = 0.5, not above
    assert (d.index, d.rule) == (0, "least-load")
    d = policy.select(views(2, in_flight=[1, 2]), text("aaaabccc"))  # 5 of 8 on backend 1
    assert (d.index, d.rule) == (1, "prefix-match")


def test_imbalance_needs_both_the_absolute_and_the_relative_threshold():
    policy = create_policy("sglang-cache-aware")
    policy.select(views(2, in_flight=[0, 1]), text("the shared prompt"))  # on backend 0
    same = text("the shared prompt")
    assert policy.select(views(2, in_flight=[65, 0]), same).rule == "load-guard"
    assert policy.select(views(2, in_flight=[64, 0]), same).rule == "prefix-match"
    assert policy.select(views(2, in_flight=[300, 230]), same).rule == "prefix-match"  # 300 < 1.5 x 230
    d = policy.select(views(2, in_flight=[250, 150]), same)
    assert (d.index, d.rule) == (1, "load-guard")


def test_a_load_guard_decision_still_teaches_the_tree():
    policy = create_policy("sglang-cache-aware")
    policy.select(views(2, in_flight=[100, 0]), text("routed by load"))
    d = policy.select(views(2, in_flight=[0, 0]), text("routed by load"))
    assert (d.index, d.rule) == (1, "prefix-match")


def test_ties_go_to_the_first_backend_offered():
    policy = create_policy("sglang-cache-aware")
    backends = views(3, in_flight=[2, 1, 1])
    assert policy.select(backends, text("x")).index == 1


def test_the_match_names_the_backend_that_first_sent_the_text():
    policy = create_policy("sglang-cache-aware")
    policy.select(views(2, in_flight=[0, 0]), text("hello world"))  # backend 0 creates the node
    policy.select(views(2, in_flight=[100, 0]), text("hello world"))  # load guard: backend 1 joins
    assert policy.select(views(2, in_flight=[0, 0]), text("hello world")).index == 0


def test_a_matched_backend_not_offered_sends_the_request_to_the_first_one():
    policy = create_policy("sglang-cache-aware")
    policy.select(views(3, in_flight=[1, 1, 0]), text("prefix held by two"))
    d = policy.select(views(2, in_flight=[3, 0]), text("prefix held by two"))
    assert (d.index, d.rule) == (0, "stale-tenant")


def test_token_ids_are_matched_when_there_is_no_text_and_predict_the_cached_tokens():
    policy = create_policy("sglang-cache-aware")
    policy.select(views(2, in_flight=[1, 0]), RequestInfo(prompt_token_ids=tuple(range(100))))
    d = policy.select(views(2, in_flight=[0, 1]), RequestInfo(prompt_token_ids=(*range(60), 7, 7)))
    assert (d.index, d.rule, d.predicted_cached_tokens) == (1, "prefix-match", 60)


def test_each_model_has_its_own_tree():
    policy = create_policy("sglang-cache-aware")
    policy.select(views(2, in_flight=[1, 0]), RequestInfo(model="a", prompt="same text"))
    assert policy.select(views(2), RequestInfo(model="b", prompt="same text")).rule == "least-load"


def test_eviction_every_n_decisions_trims_the_least_recent_leaves_down_to_max_tree_size():
    policy = create_policy("sglang-cache-aware:max_tree_size=10,eviction_interval_decisions=3")
    one = views(1)
    policy.select(one, text("aaaaaaaa"))
    policy.select(one, text("bbbbbbbb"))
    tree = policy.trees[""]
    assert tree.tenant_size["http://replica-0"] == 16
    policy.select(one, text("cccccccc"))  # third decision: 24 > 10, evict "aaaaaaaa" then "bbbbbbbb"
    assert tree.tenant_size["http://replica-0"] == 8
    assert tree.prefix_match("aaaaaaaa").matched == 0
    assert tree.prefix_match("cccccccc").matched == 8


def test_eviction_frees_a_split_prefix_only_after_its_last_leaf():
    tree = RadixTree()
    tree.insert("abcXX", "w")
    tree.insert("abcYY", "w")  # splits into "abc" -> {"XX", "YY"}
    assert tree.tenant_size["w"] == 7
    tree.evict(5)  # the older leaf "XX" goes; 5 left
    assert (tree.prefix_match("abcXX").matched, tree.prefix_match("abcYY").matched) == (3, 5)
    tree.evict(2)  # "YY" then "abc"
    assert tree.tenant_size["w"] == 0
    assert tree.prefix_match("abcYY").matched == 0


def test_reset_forgets_the_trees():
    policy = create_policy("sglang-cache-aware")
    policy.select(views(2, in_flight=[1, 0]), text("remember me"))
    policy.reset()
    assert policy.select(views(2), text("remember me")).rule == "least-load"


@pytest.mark.parametrize("spec", ["sglang-cache-aware:cache_threshold=1.5",
                                  "sglang-cache-aware:balance_abs_threshold=-1",
                                  "sglang-cache-aware:eviction_interval_decisions=-2"])
def test_bad_values_are_refused_naming_the_field(spec):
    with pytest.raises(ConfigError, match=spec.split(":")[1].split("=")[0]):
        create_policy(spec)
