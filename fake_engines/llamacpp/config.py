"""`fake-llama-server` settings. The flags and the config live below the HTTP surface, in the engine
factory (fake_engines/factory/llamacpp_config.py), so the simulator and the fixtures read flags
with the same parser; they are re-exported here for the HTTP surface."""

from __future__ import annotations

from fake_engines.factory.llamacpp_config import (
    SPLIT_MODES,
    LlamaServerConfig,
    ServerConfigError,
    parse_tensor_split,
)

__all__ = ["BUILD_INFO", "SPLIT_MODES", "LlamaServerConfig", "ServerConfigError", "parse_tensor_split"]

BUILD_INFO = "b1-0c1e570"
"""The llama.cpp build the look-alike answers as (system_fingerprint, /props build_info)."""
