"""The one list of scaling-policy names, a `PolicyRegistry` (see `policies.registry`), and
`NAME[:key=value,...]` specs turned into policies.

Built-in policies register themselves with `@register_policy`; plug-ins are classes named in the
`flotilla.scaling_policies` entry-point group. The CLI choices, spec parsing and listings all come
from this registry. A spec's keys fill the policy's config dataclass or the shared
`ScalingLimits`, converted by the field's type, e.g. `kpa:target=4,min_replicas=0`.
"""

from __future__ import annotations

from collections.abc import Mapping

from flotilla.errors import ConfigError
from policies.registry import (
    PolicyEntry,
    PolicyRegistry,
    UnknownPolicyError,
    convert,
    field_types,
    parse_spec,
)
from policies.scaling.base import ScalingLimits, ScalingPolicy

__all__ = ["ENTRY_POINT_GROUP", "REGISTRY", "ConfigError", "PolicyEntry", "UnknownPolicyError",
           "available_policies", "convert", "create_policy", "parse_policy_spec", "policy_entry",
           "register_policy"]

ENTRY_POINT_GROUP = "flotilla.scaling_policies"

REGISTRY: PolicyRegistry[ScalingPolicy] = PolicyRegistry("scaling", ScalingPolicy, "policies.scaling",
                                                         ENTRY_POINT_GROUP)

register_policy = REGISTRY.register
available_policies = REGISTRY.available
policy_entry = REGISTRY.entry
parse_policy_spec = parse_spec
"""Split `NAME[:key=value,...]` into the name and its raw settings (dashes in keys read as underscores)."""


def create_policy(spec: str, defaults: Mapping[str, object] | None = None) -> ScalingPolicy:
    """Build the policy a spec names, e.g. `kpa:target=4,min_replicas=0`. `defaults` supply
    config fields the spec does not set (only fields the config has); the spec's settings win."""
    entry, settings = REGISTRY.parse(spec, extra=ScalingLimits)
    config_fields = field_types(entry.config)
    config_kwargs = {k: v for k, v in (defaults or {}).items() if k in config_fields}
    config_kwargs.update((k, v) for k, v in settings.items() if k in config_fields)
    limit_kwargs = {k: v for k, v in settings.items() if k not in config_fields}
    return entry.cls(config=entry.config(**config_kwargs), limits=ScalingLimits(**limit_kwargs))
