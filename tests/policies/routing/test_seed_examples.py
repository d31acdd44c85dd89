"""The seed lesson's Examples 9 and 16, reproduced by the real policy classes through the harness."""

from __future__ import annotations

import pytest

from tests.policies.routing.harness import GROWTH_TOKENS, printed, run_example_9, run_example_16


def test_example_9_round_robin_puts_every_long_request_on_replica_0():
    run = run_example_9("round-robin")
    assert run.assignments == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    assert printed(run.mean_latency) == "601.3"
    assert run.max_latency == 2450


def test_example_9_least_outstanding_spreads_long_requests():
    run = run_example_9("least-outstanding")
    assert run.assignments == [[0, 7, 9, 10], [1, 2, 3, 8, 11], [4, 5, 6]]
    assert printed(run.mean_latency) == "415.0"
    assert run.max_latency == 950


EXAMPLE_16_ROWS = [
    ("round-robin", 72800, 95200, "56.7", [28400, 10400, 24200, 9800]),
    ("least-load:signal=prefill_tokens", 104000, 64000, "38.1", [25400, 24800, 30800, 23000]),
    ("session-affinity:home=modulo", 44000, 124000, "73.8", [26000, 8000, 5000, 5000]),
    (
        "session-affinity:home=modulo,signal=prefill_tokens,bound=1.25",
        71000,
        97000,
        "57.7",
        [21200, 17600, 15200, 17000],
    ),
]


@pytest.mark.parametrize(("spec", "computed", "reused", "hit_rate", "work"), EXAMPLE_16_ROWS)
def test_example_16_rows(spec, computed, reused, hit_rate, work):
    run = run_example_16(spec)
    assert (run.computed, run.reused) == (computed, reused)
    assert printed(run.hit_rate_percent) == hit_rate
    assert run.work == work


def seed_bounded_rule(session: int, work: list[int]) -> int:
    """Example 16's bounded rule, literally: integer mean, home while work <= 1.25 x mean."""
    mean = sum(work) // len(work)
    home = session % len(work)
    if work[home] <= 1.25 * mean:
        return home
    return min(range(len(work)), key=lambda r: (work[r], r))


def test_example_16_bounded_policy_makes_the_seed_rules_decisions_with_exact_mean():
    run = run_example_16("session-affinity:home=modulo,signal=prefill_tokens,bound=1.25")
    for step, (replica, _, work_before) in enumerate(run.decisions):
        assert replica == seed_bounded_rule(step % len(GROWTH_TOKENS), list(work_before))
    assert {rule for _, rule, _ in run.decisions} == {"home", "bound"}
