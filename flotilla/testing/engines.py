"""A `FleetSpec` as the fleet model: one engine group whose flags say everything about its engines.

Live and simulated fleets build every replica from that group's command line through the engine
factory, exactly as `flotilla up` and `flotilla sim --fleet` do, so a live run and a simulated run
of one spec differ only in the clock, and `meta.engines` shows each replica's resolved config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fake_engines.factory import EngineFlagError, LlamaServerConfig, VllmServeConfig, option_flags
from flotilla.fleet import EngineGroup, Fleet
from flotilla.testing.spec import FleetSpec, FleetSpecError
from sim.fleet import ReplicaFactory

VLLM_DEFAULTS: dict[str, Any] = {"enable_prompt_tokens_details": True}
"""Cached tokens in usage, so prefix hits are measured (the default fleet file sets it too)."""
LLAMACPP_DEFAULTS: dict[str, Any] = {"n_ctx": 65536}
"""Room for several agent-sized prompts over the slots (llama-server's own default is 4,096)."""
SPEC_FIELDS = {"model", "served_model_name", "alias", "gpu", "host", "port", "time_scale", "seed"}
"""Engine config fields a FleetSpec sets from its own settings."""


def spec_group(spec: FleetSpec) -> EngineGroup:
    """The spec's one engine group: `engines` replicas, each started with the spec's flags."""
    defaults = VLLM_DEFAULTS if spec.flavor == "vllm" else LLAMACPP_DEFAULTS
    return EngineGroup(flavor=spec.flavor, model=spec.model, gpu=spec.gpu, name=spec.flavor, quant=spec.quant,
                       replicas=spec.engines, min_replicas=spec.engines, max_replicas=spec.engines,
                       time_scale=spec.time_scale,
                       args=tuple(_flags(spec.flavor, {**defaults, "seed": spec.seed}, spec.engine_options)))


def _flags(flavor: str, defaults: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
    for name in options:
        if name in SPEC_FIELDS:
            raise FleetSpecError(f"engine_options.{name}", options[name], "set it as a fleet setting instead")
    try:
        return option_flags(flavor, {**defaults, **options})
    except EngineFlagError as exc:
        name = str(exc).partition(":")[0]
        raise FleetSpecError(f"engine_options.{name}", options.get(name), str(exc)) from None


def spec_fleet(spec: FleetSpec) -> Fleet:
    """The fleet a FleetSpec describes: its group behind the router, no autoscaler."""
    return Fleet(engines=(spec_group(spec),), policy=spec.policy, scrape_interval_s=spec.scrape_interval_s,
                 seed=spec.seed)


def vllm_config(spec: FleetSpec, index: int = 0) -> VllmServeConfig:
    """`fake-vllm serve` settings of replica `index` (every replica of the group has the same)."""
    config = spec_group(spec).engine_config()
    assert isinstance(config, VllmServeConfig), "a vllm spec"
    return config


def llama_config(spec: FleetSpec, index: int = 0) -> LlamaServerConfig:
    """`fake-llama-server` settings of replica `index` (every replica of the group has the same)."""
    config = spec_group(spec).engine_config()
    assert isinstance(config, LlamaServerConfig), "a llamacpp spec"
    return config


def sim_replica_factory(spec: FleetSpec | Fleet) -> ReplicaFactory:
    """Replicas for `sim.fleet.FleetSim`: the real core and step-time model of each live engine."""
    from sim.build import fleet_replicas

    return fleet_replicas(spec if isinstance(spec, Fleet) else spec_fleet(spec)).make_replica
