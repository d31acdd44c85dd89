"""The single source of routing-policy names: a `PolicyRegistry` (see `policies.registry`).

Built-in policies register themselves with `@register_policy`; third-party policies are found
through the entry-point group `flotilla.routing_policies` and imported only when asked for.
The CLI, the fleet file, the proxy and the simulator all go through `create_policy`.
"""

from __future__ import annotations

import random
from typing import Any

from flotilla.errors import ConfigError
from policies.registry import EmptyConfig, PolicyEntry, PolicyRegistry, UnknownPolicyError
from policies.routing.base import RoutingPolicy

__all__ = ["ENTRY_POINT_GROUP", "REGISTRY", "ConfigError", "EmptyConfig", "PolicySpec", "UnknownPolicyError",
           "available_policies", "create_policy", "make_config", "parse_policy_spec", "policy_spec",
           "register_policy"]

ENTRY_POINT_GROUP = "flotilla.routing_policies"

REGISTRY: PolicyRegistry[RoutingPolicy] = PolicyRegistry("routing", RoutingPolicy, "policies.routing",
                                                         ENTRY_POINT_GROUP)

PolicySpec = PolicyEntry[RoutingPolicy]
"""One registered routing policy: `name`, `cls` (built as `cls(config, rng)`) and `config`."""

register_policy = REGISTRY.register
available_policies = REGISTRY.available
policy_spec = REGISTRY.entry


def parse_policy_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split `NAME[:key=value,...]` and convert each value to its config field's type."""
    entry, params = REGISTRY.parse(spec)
    return entry.name, params


def make_config(name: str, params: dict[str, Any]) -> object:
    """Build the config dataclass of `name`; its `__post_init__` validates the values."""
    return policy_spec(name).config(**params)


def create_policy(spec: str, rng: random.Random | None = None) -> RoutingPolicy:
    """Build the policy that `spec` names, e.g. `session-affinity:home=modulo,bound=1.25`."""
    entry, params = REGISTRY.parse(spec)
    return entry.cls(entry.config(**params), rng)
