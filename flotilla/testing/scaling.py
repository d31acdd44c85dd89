"""Scaling policies side by side in the fluid what-if of the seed lesson's Example 18.

The simulator has no autoscaler loop yet, so scaling comparisons drive each policy object
through `policies.scaling.fluid.simulate` and return the same `Comparison` table as routing
comparisons, with the peaks as metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flotilla.testing.compare import Comparison, Row
from policies.scaling.fluid import FluidRun, FluidScenario, RateProfile, simulate
from policies.scaling.registry import create_policy

EXAMPLE_18_RATE = "0:2,120:2,240:8,600:8"
"""Example 18's traffic: 2 requests/s, ramping to 8 between 120 s and 240 s."""


def fluid_metrics(run: FluidRun) -> dict[str, float | None]:
    """The peaks of one what-if run."""
    return {"peak_waiting": run.peak_waiting, "peak_queueing_delay_s": run.peak_queueing_delay_s,
            "peak_replicas": run.peak_replicas, "scale_ups": run.scale_ups}


def compare_scaling(policies: Sequence[str], rate: str | RateProfile = EXAMPLE_18_RATE,
                    **scenario: Any) -> Comparison:
    """Each scaling-policy spec through the same arrivals and cold start.

    `scenario` holds `FluidScenario` fields: capacity_rps, cold_start_s, duration_s, ..."""
    profile = RateProfile.parse(rate) if isinstance(rate, str) else rate
    fluid = FluidScenario(**scenario)
    rows = []
    for spec in policies:
        run = simulate(create_policy(spec), profile, fluid)
        rows.append(Row(spec, fluid_metrics(run), run))
    return Comparison(tuple(rows))
