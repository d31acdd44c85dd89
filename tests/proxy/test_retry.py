import random

import pytest

from proxy.config import ConfigError, RetryConfig
from proxy.retry import backoff_s, is_retryable_status, parse_retry_after_s, wait_before_retry_s


def test_only_connect_class_statuses_are_retryable() -> None:
    assert [s for s in (200, 400, 404, 429, 500, 501, 502, 503, 504) if is_retryable_status(s)] == [429, 502, 503, 504]


def test_backoff_grows_exponentially_up_to_the_cap_within_the_jitter() -> None:
    cfg = RetryConfig(initial_backoff_s=0.05, max_backoff_s=0.3, multiplier=2.0, jitter=0.1)
    rng = random.Random(1)
    for n, base in [(1, 0.05), (2, 0.1), (3, 0.2), (4, 0.3), (9, 0.3)]:
        assert base * 0.9 <= backoff_s(cfg, n, rng) <= base * 1.1


def test_backoff_is_reproducible_from_the_injected_rng() -> None:
    cfg = RetryConfig()
    assert [backoff_s(cfg, 1, random.Random(5)) for _ in range(2)] == [backoff_s(cfg, 1, random.Random(5))] * 2


def test_retry_after_lengthens_the_wait_up_to_its_cap() -> None:
    cfg = RetryConfig(initial_backoff_s=0.01, jitter=0.0, max_retry_after_s=2.0)
    assert wait_before_retry_s(cfg, 1, random.Random(0), 1.5) == 1.5
    assert wait_before_retry_s(cfg, 1, random.Random(0), 60.0) == 2.0
    assert wait_before_retry_s(cfg, 1, random.Random(0), None) == 0.01


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert parse_retry_after_s("3") == 3.0
    assert parse_retry_after_s("Wed, 21 Oct 2015 07:28:10 GMT", now_epoch_s=1445412480.0) == 10.0
    assert parse_retry_after_s("soon", now_epoch_s=0.0) is None
    assert parse_retry_after_s(None) is None


def test_invalid_retry_config_names_the_field() -> None:
    with pytest.raises(ConfigError) as exc:
        RetryConfig(jitter=1.5)
    assert exc.value.field == "jitter"
