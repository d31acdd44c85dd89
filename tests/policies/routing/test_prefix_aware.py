from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from tests.policies.routing.harness import views

SYSTEM = "S" * 128  # two 64-character blocks


def chat(*turns: str) -> RequestInfo:
    """A rendered chat prompt: the system prompt, then every turn in order."""
    return RequestInfo(prompt=SYSTEM + "".join(turns))


def test_a_later_turn_follows_the_whole_conversation_not_only_the_first_message():
    policy = create_policy("prefix-aware")
    first = policy.select(views(3, in_flight=[1, 1, 0]), chat("a" * 128))
    assert (first.index, first.rule) == (2, "least-load")
    # Another conversation with the same system prompt shares 2 of 4 blocks with the first.
    other = policy.select(views(3, in_flight=[0, 0, 1]), chat("b" * 128))
    assert (other.index, other.rule) == (2, "prefix-match")
    # Turn two of the first conversation matches 4 of its 6 blocks on backend 2.
    again = policy.select(views(3, in_flight=[0, 0, 2]), chat("a" * 128, "c" * 128))
    assert (again.index, again.rule) == (2, "prefix-match")


def test_best_match_must_exceed_the_cache_threshold():
    policy = create_policy("prefix-aware:cache_threshold=0.5")
    policy.select(views(2, in_flight=[1, 0]), chat("a" * 128))  # indexed on backend 1
    d = policy.select(views(2, in_flight=[0, 1]), chat("b" * 128))  # 2 of 4 blocks = 0.5
    assert (d.index, d.rule) == (0, "least-load")


def test_load_guard_needs_both_the_absolute_and_relative_imbalance():
    policy = create_policy("prefix-aware")
    policy.select(views(2, in_flight=[0, 1]), chat("a" * 128))  # indexed on backend 0
    same = chat("a" * 128)
    assert policy.select(views(2, in_flight=[70, 0]), same).rule == "load-guard"
    assert policy.select(views(2, in_flight=[64, 0]), same).rule == "prefix-match"
    assert policy.select(views(2, in_flight=[300, 230]), same).rule == "prefix-match"  # 300 < 1.5 x 230
    d = policy.select(views(2, in_flight=[250, 150]), same)
    assert (d.index, d.rule) == (1, "load-guard")


def test_each_backends_index_is_sized_from_its_cache_capacity():
    policy = create_policy("prefix-aware")
    backends = views(2, in_flight=[0, 1], cache_capacity_tokens=[32, None])  # 2 blocks on backend 0
    policy.select(backends, RequestInfo(prompt_token_ids=tuple(range(64))))
    assert policy.match_fraction(backends[0], RequestInfo(prompt_token_ids=tuple(range(64)))) == 0.5


def test_reset_forgets_what_was_learned():
    policy = create_policy("prefix-aware")
    backends = views(2, in_flight=[1, 0])
    policy.select(backends, chat("a" * 128))
    policy.reset()
    assert policy.select(views(2), chat("a" * 128)).rule == "least-load"


def test_each_decision_predicts_the_cached_tokens_of_the_chosen_backend():
    policy = create_policy("prefix-aware")
    assert policy.select(views(2, in_flight=[1, 0]), chat("a" * 128)).predicted_cached_tokens == 0
    # the system prompt's 2 blocks of 64 characters, 16 tokens each, are on backend 1
    d = policy.select(views(2, in_flight=[0, 1]), chat("b" * 128))
    assert (d.index, d.predicted_cached_tokens) == (1, 32)
    # the load guard sends it where nothing of it is cached, and says so
    d = policy.select(views(2, in_flight=[0, 100]), chat("a" * 128))
    assert (d.index, d.rule, d.predicted_cached_tokens) == (0, "load-guard", 0)
