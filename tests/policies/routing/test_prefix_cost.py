from __future__ import annotations

import pytest

from policies.routing import ConfigError, RequestInfo, create_policy
from tests.policies.routing.harness import views

SYSTEM = tuple(range(1000, 1000 + 16 * 10))  # a 10-block system prompt


def turn(session: int, blocks: int) -> RequestInfo:
    """The shared system prompt, then `blocks` blocks of this session's own tokens."""
    return RequestInfo(prompt_token_ids=SYSTEM + tuple(range(session * 10_000, session * 10_000 + 16 * blocks)))


def primed(first: RequestInfo, spec: str = "prefix-cost"):  # type: ignore[no-untyped-def]
    """A policy whose index holds `first` on backend 0 of two."""
    policy = create_policy(spec)
    assert policy.select(views(2), first).index == 0  # nothing cached, equal load: lowest index
    return policy


def test_a_shared_system_prompt_is_worth_only_its_own_prefill_against_queued_work():
    # session 2 shares the 10 system blocks with backend 0, which holds 100 blocks of work:
    # 8 x 10 + 100 = 180 there against 8 x 20 + 0 = 160 on the empty backend (overlap_weight 8)
    d = primed(turn(1, 10)).select(views(2, in_flight_tokens=[1600, 0]), turn(2, 10))
    assert (d.index, d.rule) == (1, "least-load")
    # with only 60 blocks in hand, the cache still wins: 8 x 10 + 60 = 140 < 160
    d = primed(turn(1, 10)).select(views(2, in_flight_tokens=[960, 0]), turn(2, 10))
    assert (d.index, d.rule) == (0, "prefix-match")


def test_a_session_stays_while_moving_would_cost_more_than_the_load_it_avoids():
    # 40 blocks cached at home; the next turn adds 5: 8 x 5 + 300 = 340 at home against
    # 8 x 45 + 0 = 360 elsewhere, and one more queued request at home tips it (370 > 360)
    assert primed(turn(1, 30)).select(views(2, in_flight_tokens=[4800, 0]), turn(1, 35)).index == 0
    assert primed(turn(1, 30)).select(views(2, in_flight_tokens=[5280, 0]), turn(1, 35)).index == 1


def test_ties_go_to_fewer_blocks_in_hand_then_the_lower_index():
    policy = create_policy("prefix-cost:overlap_weight=1")
    policy.select(views(3), turn(1, 4))  # 14 blocks cached on backend 0
    # backend 0: 0 to prefill + 14 in hand; backends 1 and 2: 14 to prefill + 0 in hand
    d = policy.select(views(3, in_flight_tokens=[224, 0, 0]), turn(1, 4))
    assert (d.index, d.rule) == (1, "least-load")


def test_weight_zero_routes_on_reserved_tokens_alone():
    policy = create_policy("prefix-cost:overlap_weight=0")
    policy.select(views(2), turn(1, 10))
    assert policy.select(views(2, in_flight_tokens=[16, 0]), turn(1, 10)).index == 1


def test_text_prompts_are_cut_into_blocks_of_characters():
    policy = create_policy("prefix-cost")
    policy.select(views(2, in_flight_tokens=[0, 64]), RequestInfo(prompt="x" * 640))  # 10 blocks on 0
    d = policy.select(views(2, in_flight_tokens=[64, 0]), RequestInfo(prompt="x" * 640 + "y" * 64))
    assert (d.index, d.rule) == (0, "prefix-match")


def test_bad_weight_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="overlap_weight"):
        create_policy("prefix-cost:overlap_weight=-1")


def test_reset_forgets_what_was_learned():
    policy = create_policy("prefix-cost")
    policy.select(views(2), turn(1, 10))
    policy.reset()
    assert policy.select(views(2, in_flight_tokens=[16, 0]), turn(1, 10)).rule == "least-load"


def test_the_decision_predicts_the_cached_tokens_it_counted_on():
    d = primed(turn(1, 30)).select(views(2, in_flight_tokens=[4800, 0]), turn(1, 35))
    assert (d.index, d.predicted_cached_tokens) == (0, 40 * 16)
