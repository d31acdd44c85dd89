"""When to retry and how long to wait (pure; randomness is injected).

Retries happen only before the first byte reached the client, always to a backend not tried
yet for this request.
"""

from __future__ import annotations

import random
from email.utils import parsedate_to_datetime

from proxy.config import RetryConfig

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
OVERLOAD_STATUS = frozenset({429})
"""Statuses that mean "busy", not "broken": retried but not counted against the breaker."""


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS


def backoff_s(config: RetryConfig, retry_number: int, rng: random.Random) -> float:
    """Wait before retry number `retry_number` (1 for the first retry): capped exponential with jitter."""
    base = min(config.max_backoff_s, config.initial_backoff_s * config.multiplier ** (retry_number - 1))
    return base * rng.uniform(1.0 - config.jitter, 1.0 + config.jitter)


def parse_retry_after_s(value: str | None, now_epoch_s: float | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds, or an HTTP date when `now_epoch_s` is given."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    if now_epoch_s is None:
        return None
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now_epoch_s)
    except (TypeError, ValueError):
        return None


def wait_before_retry_s(config: RetryConfig, retry_number: int, rng: random.Random,
                        retry_after_s: float | None) -> float:
    """The backoff, lengthened to a backend's Retry-After up to `max_retry_after_s`.

    The retry goes to a different backend, so a longer Retry-After (which speaks for the busy
    backend only) is not waited out in full.
    """
    wait = backoff_s(config, retry_number, rng)
    if retry_after_s is not None:
        wait = max(wait, min(retry_after_s, config.max_retry_after_s))
    return wait
