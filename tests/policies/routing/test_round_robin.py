from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from tests.policies.routing.harness import views


def test_requests_take_turns_and_carry_on_when_the_pool_shrinks():
    policy = create_policy("round-robin")
    three = views(3)
    picks = [policy.select(three, RequestInfo()) for _ in range(4)]
    assert [d.index for d in picks] == [0, 1, 2, 0]
    assert {d.rule for d in picks} == {"round-robin"}
    # Backend 1 is gone: request 4 takes position 4 mod 2 of the remaining two.
    assert policy.select([three[0], three[2]], RequestInfo()).index == 0
    assert policy.select([], RequestInfo()) is None
