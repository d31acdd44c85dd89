"""Scaling comparisons in the fluid what-if, as the same table as routing comparisons."""

import pytest

from flotilla.testing.scaling import compare_scaling
from policies.scaling.base import ConfigError
from policies.scaling.fluid import RateProfile


def test_a_flat_rate_within_one_replica_needs_no_scale_up_under_any_policy():
    table = compare_scaling(["seed", "cold-start-aware", "target-tracking"], RateProfile(((0.0, 1.0),)),
                            duration_s=300)
    assert table.metric("peak_replicas") == {"seed": 1, "cold-start-aware": 1, "target-tracking": 1}
    assert table.metric("peak_waiting") == {"seed": 0.0, "cold-start-aware": 0.0, "target-tracking": 0.0}


def test_policy_settings_in_the_spec_change_the_outcome():
    table = compare_scaling(["seed", "seed:target_utilization=0.5"], "0:4", duration_s=120, cold_start_s=10)
    # after 30 s of 4/s on one 2/s replica 60 requests wait: ceil((4 + 60 / 60) / (0.8 x 2)) = 4,
    # and at 50 % utilization ceil(5 / 1) = 5
    assert table.metric("peak_replicas") == {"seed": 4, "seed:target_utilization=0.5": 5}
    assert table["seed"].result.policy == "seed"


def test_bad_scenario_fields_are_refused_by_name():
    with pytest.raises(ConfigError, match="cold_start_s"):
        compare_scaling(["seed"], cold_start_s=-1)
