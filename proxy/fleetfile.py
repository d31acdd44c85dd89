"""The fleet file of `flotilla up`. The fleet model and its loader live in `flotilla.fleet`; the
names here are the ones `flotilla up`, the deployment generators and the tests have used, kept as
aliases (`UpFleet` is `Fleet`, `load_up_fleet` is `load_fleet_file`)."""

from __future__ import annotations

from flotilla.fleet import (
    ACTUATORS,
    DEFAULT_FLEET,
    ENGINE_FLAVORS,
    AutoscalerSection,
    DemoSection,
    EngineGroup,
    Fleet,
    load_fleet_file,
    parse_fleet_file,
    without_address,
)

__all__ = ["ACTUATORS", "DEFAULT_FLEET", "ENGINE_FLAVORS", "AutoscalerSection", "DemoSection", "EngineGroup",
           "UpFleet", "load_up_fleet", "parse_up_fleet", "without_address"]

UpFleet = Fleet
load_up_fleet = load_fleet_file
parse_up_fleet = parse_fleet_file
