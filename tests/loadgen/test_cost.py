"""What a run's fleet cost, from a live run's polled replica counts."""

from __future__ import annotations

import pytest

from loadgen.cost import cost_in_time_scale, live_cost


def test_polled_counts_integrate_to_replica_seconds_with_each_rise_a_cold_start() -> None:
    # 1 replica for 10 s, 3 for 5 s, 2 until the run ends at 20 s: 10 + 15 + 10 = 35
    meta = live_cost([(0.0, 1), (10.0, 3), (15.0, 2)], end_s=20.0, gpus=4)
    assert meta["replica_seconds"] == pytest.approx(35) and meta["gpu_seconds"] == pytest.approx(140)
    assert meta["cold_starts"] == 2
    assert [(e["at_s"], e["direction"], e["from_replicas"], e["to_replicas"], e["reason"])
            for e in meta["scale_events"]] == [(10.0, "up", 1, 3, "observed"), (15.0, "down", 3, 2, "observed")]


def test_without_samples_the_cost_is_unknown_not_zero() -> None:
    meta = live_cost([], end_s=20.0)
    assert meta["replica_seconds"] is None and meta["gpu_seconds"] is None and meta["cold_starts"] is None


def test_a_time_scaled_run_reports_modelled_seconds() -> None:
    meta = live_cost([(0.0, 1), (1.0, 2)], end_s=2.0)
    scaled = cost_in_time_scale(meta, 0.1)
    assert scaled["replica_seconds"] == pytest.approx(30) and scaled["scale_events"][0]["at_s"] == pytest.approx(10)
