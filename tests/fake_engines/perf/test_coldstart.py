from __future__ import annotations

import pytest

from fake_engines.perf.coldstart import LESSON_SOURCES, backlog_requests, cold_start_s, load_s

SEED_EXAMPLE_17 = [
    # (source index, size bytes, load s, total cold start s) as printed
    (0, 16.1e9, "128.8", "188.8"),
    (1, 16.1e9, "16.1", "76.1"),
    (2, 16.1e9, "5.4", "65.4"),
    (3, 16.1e9, "1.6", "61.6"),
    (0, 70.6e9, "564.8", "624.8"),
    (1, 70.6e9, "70.6", "130.6"),
    (2, 70.6e9, "23.5", "83.5"),
    (3, 70.6e9, "7.1", "67.1"),
]


@pytest.mark.parametrize(("source", "size", "load", "total"), SEED_EXAMPLE_17)
def test_seed_example_17_load_and_cold_start(source: int, size: float, load: str, total: str) -> None:
    gbps = LESSON_SOURCES[source].load_gbps
    assert f"{load_s(size, gbps):.1f}" == load
    assert f"{cold_start_s(size, gbps, startup_s=20, warmup_s=40):.1f}" == total


def test_seed_example_17_backlog() -> None:
    assert f"{backlog_requests(5, 2, 70):.0f}" == "210"
    assert f"{backlog_requests(5, 2, 600):.0f}" == "1800"


def test_ready_capacity_above_arrivals_leaves_no_backlog() -> None:
    assert backlog_requests(5, 2, 600, ready_replicas=3) == 0.0
    assert backlog_requests(5, 2, 100, ready_replicas=2) == 100.0


def test_lesson_sources_are_the_four_rates() -> None:
    assert [s.load_gbps for s in LESSON_SOURCES] == [0.125, 1.0, 3.0, 10.0]


def test_bad_rates_are_rejected_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="load_gbps"):
        cold_start_s(1e9, 0, 20, 40)
    with pytest.raises(ValueError, match="warmup_s"):
        cold_start_s(1e9, 1, 20, -1)
    with pytest.raises(ValueError, match="arrival_rate"):
        backlog_requests(-1, 2, 70)
