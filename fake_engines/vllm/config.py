"""`fake-vllm serve` settings. The flags and the config live below the HTTP surface, in the engine
factory (fake_engines/factory/vllm_config.py), so the simulator and the fixtures read flags with
the same parser; they are re-exported here for the HTTP surface."""

from __future__ import annotations

from fake_engines.factory.vllm_config import (
    AUTO_MAX_MODEL_LEN,
    DTYPE_BITS,
    ServeConfigError,
    VllmServeConfig,
    default_batch_limits,
    parse_lora_modules,
)

__all__ = ["AUTO_MAX_MODEL_LEN", "DTYPE_BITS", "VLLM_VERSION", "ServeConfigError", "VllmServeConfig",
           "default_batch_limits", "parse_lora_modules"]

VLLM_VERSION = "0.32.0"
"""The vLLM release the look-alike answers as (/version, system_fingerprint)."""
