"""Prefix-cache counters from engine /metrics and the fleet hit rate over a run."""

from __future__ import annotations

import pytest

from bench.peers.quality import FleetConfig, hit_rate, prefix_counters

METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama-3.1-8b"} 59661.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="llama-3.1-8b"} 1.7960980022529638e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="llama-3.1-8b"} 9728.0
vllm:prefix_cache_hits_total{engine="1",model_name="llama-3.1-8b"} 272.0
# HELP vllm:external_prefix_cache_hits_total External prefix cache hits.
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="llama-3.1-8b"} 5.0
"""


def test_counters_sum_label_sets_and_ignore_created_and_external() -> None:
    assert prefix_counters(METRICS) == (10000.0, 59661.0)


def test_fleet_hit_rate_is_token_weighted_over_the_run() -> None:
    before = [(100.0, 1000.0), (0.0, 0.0)]
    after = [(400.0, 2000.0), (300.0, 3000.0)]
    rate, queried = hit_rate(before, after)
    assert rate == pytest.approx(600 / 4000)
    assert queried == [1000, 3000]


def test_no_queries_means_zero_hit_rate() -> None:
    assert hit_rate([(0.0, 0.0)], [(0.0, 0.0)]) == (0.0, [0])


def test_fleet_config_names_the_bad_field() -> None:
    with pytest.raises(ValueError, match="time_scale"):
        FleetConfig(time_scale=0)
    with pytest.raises(ValueError, match="engines"):
        FleetConfig(engines=0)
