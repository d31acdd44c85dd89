"""One engine config per replica of a `FleetSpec`, shared by the live and the simulated fleet.

The simulated replica is built from the very config the live server would start with (same
KV-cache sizing, batch limits, seed and step-time model), so a live run and a simulated run of
one spec differ only in the clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.perf.batch import StepBatch
from fake_engines.vllm.config import VllmServeConfig
from flotilla.testing.spec import FleetSpec, FleetSpecError
from sim.fleet import ReplicaFactory
from sim.replicas import CoreReplica, Listener, stepwise_run_time

VLLM_DEFAULTS: dict[str, Any] = {"max_model_len": 32768, "enable_prompt_tokens_details": True}
"""Room for agent-sized prompts, and cached tokens in usage so prefix hits are measured."""
LLAMACPP_DEFAULTS: dict[str, Any] = {"n_ctx": 65536, "metrics": True}
"""Room for several agent-sized prompts over the slots, and /metrics for the proxy's scrapes."""


def vllm_config(spec: FleetSpec, index: int) -> VllmServeConfig:
    """`fake-vllm serve` settings of replica `index`."""
    fixed = {"model": spec.model, "served_model_name": spec.served_model, "gpu": spec.gpu, "port": 0,
             "time_scale": spec.time_scale, "seed": spec.seed + index}
    return VllmServeConfig(**_merge(VllmServeConfig, fixed, VLLM_DEFAULTS, spec.engine_options))


def llama_config(spec: FleetSpec, index: int) -> LlamaServerConfig:
    """`fake-llama-server` settings of replica `index`."""
    fixed = {"model": f"{spec.model}-{spec.quant}.gguf", "alias": spec.served_model, "gpu": spec.gpu,
             "port": 0, "time_scale": spec.time_scale, "seed": spec.seed + index}
    return LlamaServerConfig(**_merge(LlamaServerConfig, fixed, LLAMACPP_DEFAULTS, spec.engine_options))


def _merge(config_cls: type, fixed: dict[str, Any], defaults: dict[str, Any],
           options: Any) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(config_cls)}
    for name in options:
        if name not in known:
            raise FleetSpecError(f"engine_options.{name}", options[name],
                                 f"not a {config_cls.__name__} field; known: {sorted(known)}")
        if name in fixed:
            raise FleetSpecError(f"engine_options.{name}", options[name], "set it as a fleet setting instead")
    return {**defaults, **options, **fixed}


def sim_replica_factory(spec: FleetSpec) -> ReplicaFactory:
    """Replicas for `sim.fleet.FleetSim`: the real core and step-time model of each live engine."""

    def make(index: int, listener: Listener) -> CoreReplica:
        if spec.flavor == "vllm":
            return _vllm_replica(vllm_config(spec, index), index, listener)
        return _llama_replica(llama_config(spec, index), index, listener)

    return make


def _vllm_replica(config: VllmServeConfig, index: int, listener: Listener) -> CoreReplica:
    from fake_engines.vllm import engine

    sized = engine.size_engine(config)
    return _replica(index, engine.build_scheduler(config, sized), engine.step_time_fn(config, sized), listener)


def _llama_replica(config: LlamaServerConfig, index: int, listener: Listener) -> CoreReplica:
    from fake_engines.llamacpp import engine
    from fake_engines.llamacpp.model import load_model

    model = load_model(config.model)
    sized = engine.size_engine(config, model)
    return _replica(index, engine.build_scheduler(config, model), engine.step_time_fn(sized), listener)


def _replica(index: int, core: Any, step_time: Callable[[StepBatch], float], listener: Listener) -> CoreReplica:
    # decode runs need the fleet's event queue, to land mid-run reads on the right instant
    return CoreReplica(index, core, step_time, listener, queue=getattr(listener, "queue", None),
                       decode_run_time=stepwise_run_time(step_time))
