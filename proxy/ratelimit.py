"""Token buckets per client key (pure: callers pass `now_s`), and who counts as one client."""

from __future__ import annotations

import ipaddress
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

    def wait_s(self, key: str, now_s: float) -> float:
        """Seconds until `key` has a token (0.0: it has one now), spending nothing."""
        bucket = self.buckets.get(key)
        if bucket is None:
            return 0.0
        tokens = min(self.burst, bucket.tokens + (now_s - bucket.updated_s) * self.rate_per_s)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate_per_s


def client_id(address: str | None) -> str:
    """The client an address belongs to: the IPv4 address, or the IPv6 /64 (one host usually
    holds a whole /64, so single IPv6 addresses would be free to mint)."""
    if not address:
        return ""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address  # not an IP (a unix socket path): the peer as it is
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def retry_after_header(wait_s: float) -> str:
    return str(max(1, math.ceil(wait_s)))
