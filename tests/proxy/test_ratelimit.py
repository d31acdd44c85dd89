"""Token buckets per key: burst, refill, per-key isolation and bounded key count."""

from __future__ import annotations

from proxy.ratelimit import RateLimiter, retry_after_header


def test_a_full_bucket_allows_the_burst_then_says_how_long_to_wait():
    rl = RateLimiter(rate_per_s=2.0, burst=3.0, max_keys=10)
    assert [rl.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rl.take("a", 0.0) == 0.5  # one token at 2/s
    assert rl.take("a", 0.25) == 0.25  # half a token came back: a quarter second to go


def test_tokens_refill_at_the_rate_up_to_the_burst():
    rl = RateLimiter(rate_per_s=2.0, burst=3.0, max_keys=10)
    for _ in range(3):
        rl.take("a", 0.0)
    assert rl.take("a", 1.0) == 0.0  # two tokens back, one spent
    assert rl.buckets["a"].tokens == 1.0
    assert rl.take("a", 100.0) == 0.0
    assert rl.buckets["a"].tokens == 2.0  # capped at the burst, one spent


def test_keys_have_their_own_buckets():
    rl = RateLimiter(rate_per_s=1.0, burst=1.0, max_keys=10)
    assert rl.take("a", 0.0) == 0.0
    assert rl.take("a", 0.0) == 1.0
    assert rl.take("b", 0.0) == 0.0


def test_least_recently_seen_keys_are_forgotten_past_max_keys():
    rl = RateLimiter(rate_per_s=1.0, burst=1.0, max_keys=2)
    for key in ("a", "b", "c"):
        rl.take(key, 0.0)
    assert list(rl.buckets) == ["b", "c"]


def test_retry_after_is_whole_seconds_rounded_up_at_least_one():
    assert [retry_after_header(s) for s in (0.01, 1.0, 1.2, 7.9)] == ["1", "1", "2", "8"]


def test_waiting_time_can_be_read_without_spending_a_token():
    rl = RateLimiter(rate_per_s=2.0, burst=1.0, max_keys=10)
    assert rl.wait_s("a", 0.0) == 0.0 and "a" not in rl.buckets  # an unseen key has a full bucket
    rl.take("a", 0.0)
    assert rl.wait_s("a", 0.0) == 0.5
    assert rl.wait_s("a", 0.0) == 0.5  # looking spent nothing
    assert rl.wait_s("a", 0.5) == 0.0
