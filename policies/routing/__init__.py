"""Routing policies: pure classes that pick a backend for a request, registered by name.

Importing this package registers every built-in policy. Build one from a spec with
`create_policy("session-affinity:home=modulo,bound=1.25")`.
"""

from policies.routing import (  # noqa: F401  (imported to register the built-in policies)
    bounded_hash,
    least_load,
    least_outstanding,
    lora_affinity,
    power_of_two,
    precise_prefix,
    prefix_aware,
    prefix_capacity,
    prefix_cost,
    round_robin,
    session_affinity,
    vllm_dp,
    weighted,
)
from policies.routing.base import BackendState, BackendView, Decision, RequestInfo, RoutingPolicy
from policies.routing.registry import (
    ENTRY_POINT_GROUP,
    ConfigError,
    UnknownPolicyError,
    available_policies,
    create_policy,
    parse_policy_spec,
    policy_spec,
    register_policy,
)
from policies.routing.session_affinity import session_key_from
from policies.routing.signals import SIGNALS, least_loaded, load_of, routable_backends

__all__ = [
    "ENTRY_POINT_GROUP",
    "SIGNALS",
    "BackendState",
    "BackendView",
    "ConfigError",
    "Decision",
    "RequestInfo",
    "RoutingPolicy",
    "UnknownPolicyError",
    "available_policies",
    "create_policy",
    "least_loaded",
    "load_of",
    "parse_policy_spec",
    "policy_spec",
    "register_policy",
    "routable_backends",
    "session_key_from",
]
