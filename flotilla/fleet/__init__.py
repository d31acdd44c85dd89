"""One fleet model: what a fleet is (engine groups with their flags and counts, the router and its
policy, the autoscaler and its limits, SLOs), one loader for the fleet file, one place for defaults.

    fleet = load_fleet_file("fleet.yaml")       # or load_fleet_file() for proxy/fleet.default.yaml
    fleet.engines[0].command(port=8001)         # a replica's engine command line
    fleet.started()                             # the replicas `flotilla up` starts, in proxy order

`flotilla up`, `flotilla sim --fleet`, the pytest fixtures (`flotilla_fleet(fleet=...)`, or
`flotilla.testing.FleetSpec`, a one-group fleet from keywords) and `flotilla compose` /
`flotilla k8s` all take a `Fleet`. At load time it imports only leaf modules (`proxy.config`,
`loadgen.results`, `flotilla.errors`), so `proxy/`, `sim/` and `flotilla/testing` all import it
without a cycle.
"""

from flotilla.fleet.load import (
    DEFAULT_FLEET,
    default_fleet_path,
    fleet_from_mapping,
    load_fleet_file,
    parse_fleet_file,
)
from flotilla.fleet.model import (
    ACTUATORS,
    DEFAULT_POLICY,
    ENGINE_FLAVORS,
    AutoscalerSection,
    DemoSection,
    EngineGroup,
    Fleet,
    without_address,
)

__all__ = [
    "ACTUATORS",
    "DEFAULT_FLEET",
    "DEFAULT_POLICY",
    "ENGINE_FLAVORS",
    "AutoscalerSection",
    "DemoSection",
    "EngineGroup",
    "Fleet",
    "default_fleet_path",
    "fleet_from_mapping",
    "load_fleet_file",
    "parse_fleet_file",
    "without_address",
]
