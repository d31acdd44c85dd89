"""Weights and KV-cache memory, GPUs needed, and the time to read the weights once (seed Example 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fake_engines.perf.catalogue import ModelSpec

PRECISIONS_BITS = (16.0, 8.0, 4.5)
"""The lesson's three precisions: BF16, 8-bit, and a 4-bit quantisation with its scales (Q4_K-like)."""


@dataclass(frozen=True)
class FitReport:
    """Does one model at one precision fit, and how fast can its weights be read."""

    model: str
    """Model name."""
    bits: float
    """Bits per weight."""
    weights_bytes: float
    """All weights at this precision, bytes."""
    kv_bytes: float
    """KV cache for every user at full context, bytes."""
    gpus: int
    """GPUs needed so weights plus KV fit in the usable memory of each."""
    read_1gpu_s: float
    """Time to read every weight once on one GPU (the decode-step floor), seconds."""
    read_split_s: float
    """The same read spread perfectly over ``gpus`` GPUs, seconds."""

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes


def kv_cache_bytes(model: ModelSpec, users: int, context_tokens: int, dtype_bytes: int = 2) -> float:
    """KV cache for ``users`` sequences of ``context_tokens`` each, bytes."""
    return float(model.kv_bytes_per_token(dtype_bytes)) * users * context_tokens


def gpus_needed(total_bytes: float, usable_bytes_per_gpu: float) -> int:
    """Fewest GPUs whose usable memory holds ``total_bytes``."""
    if usable_bytes_per_gpu <= 0:
        raise ValueError("usable_bytes_per_gpu must be positive")
    return max(1, math.ceil(total_bytes / usable_bytes_per_gpu))


def weight_read_s(weight_bytes: float, bandwidth_bytes_s: float, gpus: int = 1) -> float:
    """Time for ``gpus`` GPUs to read their equal shares of the weights once, seconds."""
    return weight_bytes / gpus / bandwidth_bytes_s


def fit(model: ModelSpec, bits: float, users: int, context_tokens: int,
        usable_bytes_per_gpu: float, bandwidth_bytes_s: float, kv_dtype_bytes: int = 2) -> FitReport:
    """Example 1's row: weights, KV, total, GPUs needed, weight-read time on one GPU and split."""
    weights = model.weight_bytes(bits)
    kv = kv_cache_bytes(model, users, context_tokens, kv_dtype_bytes)
    gpus = gpus_needed(weights + kv, usable_bytes_per_gpu)
    return FitReport(model=model.name, bits=bits, weights_bytes=weights, kv_bytes=kv, gpus=gpus,
                     read_1gpu_s=weight_read_s(weights, bandwidth_bytes_s),
                     read_split_s=weight_read_s(weights, bandwidth_bytes_s, gpus))


def matmul_time_s(params: float, tokens: int, flops_s: float, gpus: int = 1) -> float:
    """Arithmetic of a forward pass at the datasheet rate: 2 x params x tokens FLOPs over ``gpus``."""
    return 2.0 * params * tokens / gpus / flops_s
