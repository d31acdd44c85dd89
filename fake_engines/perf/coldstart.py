"""Cold start of a new replica and the backlog it leaves behind.

A replica is ready after process/container startup, loading the weights from their source, and
engine warm-up (vLLM's CUDA-graph capture and compilation, llama-server's empty warm-up run).
Traffic above the ready capacity piles up for the whole cold start.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class WeightSource:
    """Where a replica reads its weights from, and how fast."""

    name: str
    """Human name, e.g. "local NVMe, 3 GB/s"."""
    load_gbps: float
    """Read rate in GB/s (1e9 bytes per second)."""


LESSON_SOURCES: tuple[WeightSource, ...] = (
    WeightSource("Hub download, 1 Gb/s", 0.125),  # 1 gigabit per second = 0.125 GB/s
    WeightSource("network volume, 1 GB/s", 1.0),
    WeightSource("local NVMe, 3 GB/s", 3.0),
    WeightSource("host page cache, 10 GB/s", 10.0),
)
"""The lesson's assumed sources; real rates are measured on the target system."""


def load_s(weight_bytes: float, load_gbps: float) -> float:
    """Seconds to read ``weight_bytes`` at ``load_gbps`` GB/s (1e9 bytes per second)."""
    if load_gbps <= 0:
        raise ValueError(f"load_gbps must be > 0, got {load_gbps}")
    if weight_bytes < 0:
        raise ValueError(f"weight_bytes must be >= 0, got {weight_bytes}")
    return weight_bytes / (load_gbps * GB)


def cold_start_s(weight_bytes: float, load_gbps: float, startup_s: float, warmup_s: float) -> float:
    """Seconds from starting a replica to its first served request: startup + load + warm-up.

    ``load_gbps`` is in GB/s (1e9 bytes per second), the unit the catalogue uses for bandwidths.
    """
    if startup_s < 0 or warmup_s < 0:
        raise ValueError(f"startup_s and warmup_s must be >= 0, got {startup_s}, {warmup_s}")
    return startup_s + load_s(weight_bytes, load_gbps) + warmup_s


def backlog_requests(arrival_rate: float, replica_rate: float, cold_start: float, ready_replicas: int = 1) -> float:
    """Requests that pile up during a cold start: arrivals above the ready capacity, times its length.

    ``arrival_rate`` and ``replica_rate`` are requests per second (arriving, and served by one
    replica); ``cold_start`` is in seconds. Traffic the ready replicas absorb leaves no backlog.
    """
    if arrival_rate < 0 or replica_rate < 0 or cold_start < 0 or ready_replicas < 0:
        raise ValueError("arrival_rate, replica_rate, cold_start and ready_replicas must be >= 0")
    return max(arrival_rate - ready_replicas * replica_rate, 0.0) * cold_start
