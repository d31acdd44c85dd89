"""Expert parallelism: work per device from expert loads, imbalance, placements, replicas (Example 8)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Which experts (or replicas of them) each device holds, and the work that gives it."""

    experts: list[list[int]]
    """experts[d]: expert ids on device d (an id may appear on several devices when replicated)."""
    work: list[float]
    """Token copies each device processes (a replicated expert's load is shared evenly)."""

    @property
    def max_work(self) -> float:
        return max(self.work)

    @property
    def mean_work(self) -> float:
        return sum(self.work) / len(self.work)

    @property
    def imbalance(self) -> float:
        """Slowest device over the mean: every device waits for the slowest in an MoE layer."""
        return self.max_work / self.mean_work


def _work(experts: list[list[int]], loads: Sequence[float]) -> list[float]:
    copies = {e: sum(e in held for held in experts) for held in experts for e in held}
    return [sum(loads[e] / copies[e] for e in held) for held in experts]


def contiguous_placement(loads: Sequence[float], devices: int) -> Placement:
    """vLLM's default: experts 0..E/n-1 on device 0, the next block on device 1, ..."""
    if len(loads) % devices:
        raise ValueError(f"experts ({len(loads)}) must divide evenly over devices ({devices})")
    per = len(loads) // devices
    experts = [list(range(d * per, (d + 1) * per)) for d in range(devices)]
    return Placement(experts=experts, work=_work(experts, loads))


def explicit_placement(experts: list[list[int]], loads: Sequence[float]) -> Placement:
    """A placement given by hand, such as the lesson's {0,7} {1,6} {2,5} {3,4}."""
    return Placement(experts=[list(e) for e in experts], work=_work(experts, loads))


def balanced_placement(loads: Sequence[float], devices: int, redundant: int = 0) -> Placement:
    """Greedy longest-first placement with equal expert slots per device.

    ``redundant`` extra slots (vLLM's num_redundant_experts) go to the hottest experts, one
    replica at a time, each replica taking an equal share of its expert's load.
    """
    slots = len(loads) + redundant
    if slots % devices:
        raise ValueError(f"experts + redundant ({slots}) must divide evenly over devices ({devices})")
    replicas = _replica_counts(loads, redundant)
    pieces = sorted(((loads[e] / replicas[e], e) for e in range(len(loads)) for _ in range(replicas[e])),
                    reverse=True)
    return explicit_placement(_greedy(pieces, devices, slots // devices), loads)


def _replica_counts(loads: Sequence[float], redundant: int) -> list[int]:
    counts = [1] * len(loads)
    for _ in range(redundant):
        hottest = max(range(len(loads)), key=lambda e: (loads[e] / counts[e], -e))
        counts[hottest] += 1
    return counts


def _greedy(pieces: list[tuple[float, int]], devices: int, per_device: int) -> list[list[int]]:
    # each piece goes to the least-loaded device with a free slot not already holding that expert
    heap = [(0.0, d) for d in range(devices)]
    held: list[list[int]] = [[] for _ in range(devices)]
    for load, expert in pieces:
        skipped = []
        while True:
            work, d = heapq.heappop(heap)
            if len(held[d]) < per_device and expert not in held[d]:
                break
            skipped.append((work, d))
        held[d].append(expert)
        heapq.heappush(heap, (work + load, d))
        for item in skipped:
            heapq.heappush(heap, item)
    return [sorted(h) for h in held]


def remote_copies(copies: Sequence[Sequence[int]]) -> int:
    """Token copies in a source-by-destination matrix that leave their device."""
    return sum(c for s, row in enumerate(copies) for d, c in enumerate(row) if s != d)


def all_to_all_bytes(remote: float, hidden: int, dtype_bytes: int = 2) -> float:
    """Dispatch plus combine: every remote token copy carries one hidden state each way."""
    return remote * hidden * dtype_bytes * 2


def expected_remote_share(devices: int) -> float:
    """Share of token copies that leave their device when experts are hit uniformly: (n - 1) / n."""
    return (devices - 1) / devices


@dataclass(frozen=True)
class Routing:
    """Where the tokens of one MoE layer went (the lesson's Example 8 program)."""

    copies: list[list[int]]
    """copies[src][dst]: token copies sent from device src to device dst."""
    expert_loads: list[int]
    """Token copies each expert received."""


def route_tokens(tokens: int, devices: int, experts: int, top_k: int, hot_experts: int = 2,
                 hot_bias: float = 1.0, seed: int = 7) -> Routing:
    """Route `tokens` (spread evenly over `devices`) to their top-k experts, experts placed
    contiguously; each token scores every expert with a Gaussian, the first `hot_experts`
    getting `hot_bias` more, drawn from java.util.Random(seed) as the lesson's program does."""
    from fake_engines.perf.java_random import JavaRandom

    rng, per_device = JavaRandom(seed), experts // devices
    copies = [[0] * devices for _ in range(devices)]
    loads = [0] * experts
    for t in range(tokens):
        src = t // (tokens // devices)
        score = [rng.next_gaussian() + (hot_bias if e < hot_experts else 0.0) for e in range(experts)]
        for e in sorted(range(experts), key=lambda e: -score[e])[:top_k]:  # stable, as Arrays.sort
            copies[src][e // per_device] += 1
            loads[e] += 1
    return Routing(copies=copies, expert_loads=loads)
