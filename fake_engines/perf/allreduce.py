"""Ring all-reduce: a step-by-step simulation (Example 4) and its cost per forward pass (Example 5)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fake_engines.perf.catalogue import LinkSpec


@dataclass(frozen=True)
class RingTrace:
    """What a ring all-reduce did, phase by phase."""

    owned_after_scatter: list[tuple[int, np.ndarray]]
    """Per device: the chunk index it holds the complete sum of after reduce-scatter, and those values."""
    final: np.ndarray
    """Every device's values after all-gather (devices x values)."""
    expected: np.ndarray
    """The element-wise sum of the inputs."""
    sent_values: list[int]
    """Values each device sent over both phases."""

    @property
    def all_equal(self) -> bool:
        return bool((self.final == self.expected).all())


def ring_allreduce(values: np.ndarray) -> RingTrace:
    """Reduce-scatter then all-gather, n - 1 steps each, all devices sending at once to the right."""
    v = np.array(values, copy=True)
    n, length = v.shape
    chunk = length // n
    sent = [0] * n

    def span(c: int) -> slice:
        return slice(c * chunk, (c + 1) * chunk)

    for s in range(n - 1):
        before = v.copy()
        for d in range(n):
            c = (d - s) % n
            v[(d + 1) % n, span(c)] += before[d, span(c)]
            sent[d] += chunk
    owned = [((d + 1) % n, v[d, span((d + 1) % n)].copy()) for d in range(n)]
    for s in range(n - 1):
        before = v.copy()
        for d in range(n):
            c = (d + 1 - s) % n
            v[(d + 1) % n, span(c)] = before[d, span(c)]
            sent[d] += chunk
    return RingTrace(owned_after_scatter=owned, final=v, expected=values.sum(axis=0), sent_values=sent)


def lesson_ring_inputs(devices: int = 4, length: int = 8) -> np.ndarray:
    """Example 4's inputs: device d holds (d + 1) * 10 + i."""
    d, i = np.indices((devices, length))
    return (d + 1) * 10 + i


def ring_bytes_per_device(tensor_bytes: float, devices: int) -> float:
    """Bytes each device sends in one ring all-reduce: 2 (n - 1) / n of the tensor."""
    return 2.0 * (devices - 1) / devices * tensor_bytes


def root_traffic_values(devices: int, length: int) -> tuple[int, int]:
    """Values the root of a naive all-reduce receives and sends: (n - 1) whole tensors each way."""
    return (devices - 1) * length, (devices - 1) * length


def ring_steps(devices: int) -> int:
    """Sequential steps of one ring all-reduce."""
    return 2 * (devices - 1)


@dataclass(frozen=True)
class PassTraffic:
    """Tensor-parallel all-reduce traffic of one forward pass."""

    tokens: int
    """Tokens in the pass."""
    allreduce_bytes: float
    """Size of one all-reduce (tokens x hidden activations), bytes."""
    bytes_per_gpu: float
    """Bytes each GPU sends over the whole pass."""
    allreduces: int
    """All-reduces per pass (two per layer)."""
    sequential_steps: int
    """Ring steps that run one after another over the pass."""

    def bandwidth_s(self, link: LinkSpec) -> float:
        """Time to move the traffic at the link's per-direction bandwidth."""
        return self.bytes_per_gpu / link.bytes_s

    def latency_s(self, step_latency_s: float) -> float:
        """Start-up delays of all sequential ring steps."""
        return self.sequential_steps * step_latency_s

    def time_s(self, link: LinkSpec) -> float:
        """Bandwidth term plus latency term on ``link``."""
        return self.bandwidth_s(link) + self.latency_s(link.latency_s)


def pass_traffic(tokens: int, hidden: int, layers: int, tp: int, dtype_bytes: int = 2) -> PassTraffic:
    """Two all-reduces per layer (after attention and after the MLP) of tokens x hidden values."""
    size = tokens * hidden * float(dtype_bytes)
    count = 2 * layers
    if tp <= 1:
        return PassTraffic(tokens, size, 0.0, 0, 0)
    return PassTraffic(tokens=tokens, allreduce_bytes=size, bytes_per_gpu=ring_bytes_per_device(size, tp) * count,
                       allreduces=count, sequential_steps=count * ring_steps(tp))
