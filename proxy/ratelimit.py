"""Token buckets per client key (pure: callers pass `now_s`)."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class Bucket:
    tokens: float
    """Requests the key may send now."""
    updated_s: float
    """When `tokens` was last refilled, seconds on the caller's clock."""


class RateLimiter:
    """`rate_per_s` requests per second per key, bursts up to `burst`; least recently seen keys
    are forgotten past `max_keys` (a forgotten key starts again with a full bucket)."""

    def __init__(self, rate_per_s: float, burst: float, max_keys: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self.buckets: OrderedDict[str, Bucket] = OrderedDict()

    def take(self, key: str, now_s: float) -> float:
        """Spend one token for `key`: 0.0 when allowed, else seconds until a token is there."""
        bucket = self.buckets.pop(key, None) or Bucket(self.burst, now_s)
        self.buckets[key] = bucket
        if len(self.buckets) > self.max_keys:
            self.buckets.popitem(last=False)
        bucket.tokens = min(self.burst, bucket.tokens + (now_s - bucket.updated_s) * self.rate_per_s)
        bucket.updated_s = now_s
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate_per_s


def retry_after_header(wait_s: float) -> str:
    return str(max(1, math.ceil(wait_s)))
