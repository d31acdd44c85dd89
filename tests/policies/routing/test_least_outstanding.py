from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from tests.policies.routing.harness import views


def test_fewest_in_flight_wins_and_ties_go_to_lowest_index():
    policy = create_policy("least-outstanding")
    decision = policy.select(views(4, in_flight=[3, 1, 2, 1], num_requests_waiting=[0, 9, 0, 0]), RequestInfo())
    assert (decision.index, decision.rule) == (1, "least-outstanding")


def test_a_burst_spreads_evenly_on_the_routers_own_count():
    policy = create_policy("least-outstanding")
    counts = [0] * 8
    for _ in range(200):
        counts[policy.select(views(8, in_flight=counts), RequestInfo()).index] += 1
    assert counts == [25] * 8
