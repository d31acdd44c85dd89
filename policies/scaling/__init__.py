"""Scaling policies: pure classes that turn signal history and fleet state into a replica count.

Build one from a spec with `create_policy("kpa:target=4,min_replicas=0")` and call
`policy.decide(history, fleet)` every `policy.interval_s` seconds.
"""

from policies.scaling.base import (
    ConfigError,
    FleetState,
    Reason,
    Recommendation,
    ReplicaInfo,
    ReplicaState,
    ScalingDecision,
    ScalingLimits,
    ScalingPolicy,
    ScalingSignals,
    measured_cold_start_s,
)
from policies.scaling.registry import (
    ENTRY_POINT_GROUP,
    UnknownPolicyError,
    available_policies,
    create_policy,
    parse_policy_spec,
    policy_entry,
    register_policy,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ConfigError",
    "FleetState",
    "Reason",
    "Recommendation",
    "ReplicaInfo",
    "ReplicaState",
    "ScalingDecision",
    "ScalingLimits",
    "ScalingPolicy",
    "ScalingSignals",
    "UnknownPolicyError",
    "available_policies",
    "create_policy",
    "measured_cold_start_s",
    "parse_policy_spec",
    "policy_entry",
    "register_policy",
]
