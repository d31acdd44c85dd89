"""Whole fleets for tests: live (look-alike engines behind the proxy) or simulated, one interface.

The pytest plugin (`flotilla.pytest_plugin`) wraps these as the `flotilla_fleet` and
`flotilla_sim` fixtures; everything here also works without pytest.
"""

from flotilla.testing.compare import Comparison, Row, compare_policies, run_metrics
from flotilla.testing.live import LiveFleet
from flotilla.testing.scaling import EXAMPLE_18_RATE, compare_scaling
from flotilla.testing.simulated import SimFleet
from flotilla.testing.spec import FleetSpec, FleetSpecError, load_fleet, load_fleet_spec
from flotilla.testing.workload import ReplayOptions, load_workload

__all__ = [
    "EXAMPLE_18_RATE",
    "Comparison",
    "FleetSpec",
    "FleetSpecError",
    "LiveFleet",
    "ReplayOptions",
    "Row",
    "SimFleet",
    "compare_policies",
    "compare_scaling",
    "load_fleet",
    "load_fleet_spec",
    "load_workload",
    "run_metrics",
]
