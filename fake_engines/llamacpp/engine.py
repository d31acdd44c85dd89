"""From llama-server flags to a sized engine. It lives below the HTTP surface, in the engine
factory (fake_engines/factory/llamacpp_engine.py); re-exported here for the HTTP surface."""

from __future__ import annotations

from fake_engines.factory.llamacpp_engine import (
    LINK,
    LlamaEngineSpec,
    build_scheduler,
    place_layers,
    scheduler_config,
    size_engine,
    step_time_fn,
)

__all__ = ["LINK", "LlamaEngineSpec", "build_scheduler", "place_layers", "scheduler_config", "size_engine",
           "step_time_fn"]
