from __future__ import annotations

import random

from policies.routing import RequestInfo, create_policy
from tests.policies.routing.harness import views


def test_less_loaded_of_the_two_drawn_candidates_wins():
    loads = [5, 0, 7, 3, 9]
    backends = views(5, in_flight=loads)
    rng = random.Random(11)
    policy = create_policy("power-of-two", rng=random.Random(11))
    for _ in range(30):
        first, second = rng.sample(range(5), 2)
        expected = min((loads[first], first), (loads[second], second))[1]
        decision = policy.select(backends, RequestInfo())
        assert (decision.index, decision.rule) == (expected, "power-of-two")


def test_a_single_backend_is_chosen_without_drawing():
    rng = random.Random(3)
    state = rng.getstate()
    assert create_policy("power-of-two", rng=rng).select(views(1), RequestInfo()).index == 0
    assert rng.getstate() == state
