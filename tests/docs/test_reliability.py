"""docs/reliability.md: every promise points at a test that exists, and the defaults it states
are the proxy's."""

from __future__ import annotations

import re

from proxy.config import BreakerConfig, HealthConfig, ProxyConfig, RetryConfig, TimeoutConfig
from proxy.limits import LimitsConfig
from tests.conftest import REPO

DOC = (REPO / "docs" / "reliability.md").read_text()


def test_every_cited_test_exists():
    refs = set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", DOC))
    assert len(refs) >= 25
    missing = [f"{path}::{name}" for path, name in refs
               if f"def {name}(" not in (REPO / path).read_text()]
    assert missing == []


def test_stated_defaults_are_the_configured_ones():
    t, r, b, h, lim = TimeoutConfig(), RetryConfig(), BreakerConfig(), HealthConfig(), LimitsConfig()
    rows = {"connect": t.connect_s, "first byte (headers)": t.first_byte_s, "idle gap between chunks": t.idle_s,
            "whole request": t.total_s, "wait in the admission queue": lim.queue_timeout_s}
    for name, seconds in rows.items():
        assert f"| {name} | {seconds:g} s |" in DOC
    assert f"{r.max_attempts} tries in all" in DOC
    assert f"{b.failure_threshold} consecutive failures" in DOC and f"{b.success_threshold} consecutive successes" in DOC
    assert f"After {b.open_s:g} s it is half-open" in DOC
    assert f"probed every {h.interval_s:g} s (timeout {h.timeout_s:g} s)" in DOC
    assert f"{lim.max_in_flight_per_model} requests forwarded at once" in DOC
    assert f"{lim.max_queued_per_model} waiting" in DOC
    assert f"up to {lim.shutdown_grace_s:g} s" in DOC
    assert f"up to {ProxyConfig().max_body_bytes // 2**20} MiB" in DOC
