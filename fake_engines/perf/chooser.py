"""A first answer to "how many GPUs, and which split?" from weights, GPU memory and topology.

The lesson's rules: keep a share of every GPU (40 % by default) for the KV cache and buffers;
round the GPU count up to a power of two so attention heads divide evenly; inside a node prefer
tensor parallelism when NVLink joins the GPUs, pipeline stages over PCIe (one exchange per
stage); across nodes tensor-parallel inside each node and pipeline stages between nodes; fill the
rest of the GPUs with data-parallel replicas. Measuring candidate layouts under load decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Deployment:
    """The hardware and the model weights a layout must fit."""

    weights_gb: float
    """Model weights in GB (1e9 bytes) at the serving precision."""
    gpu_memory_gb: float
    """Memory of one GPU in GB."""
    gpus_per_node: int = 8
    """GPUs in one server (node)."""
    nodes: int = 1
    """Servers available."""
    nvlink: bool = True
    """GPUs of a node are joined by NVLink (False: PCIe only)."""
    moe: bool = False
    """The model has expert (MoE) layers."""
    kv_reserve: float = 0.4
    """Share of each GPU kept for the KV cache and buffers, in [0, 1)."""

    def __post_init__(self) -> None:
        checks = {
            "weights_gb": self.weights_gb > 0,
            "gpu_memory_gb": self.gpu_memory_gb > 0,
            "gpus_per_node": self.gpus_per_node >= 1,
            "nodes": self.nodes >= 1,
            "kv_reserve": 0 <= self.kv_reserve < 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name} is out of range: {getattr(self, name)}")

    @property
    def total_gpus(self) -> int:
        """GPUs across all nodes."""
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class LayoutChoice:
    """The layout the rules pick for a deployment."""

    gpus_needed: int
    """Weights over the usable memory of one GPU, rounded up."""
    group_gpus: int
    """GPUs of one model copy: gpus_needed rounded up to a power of two."""
    fits: bool
    """One copy fits in the GPUs present."""
    tp: int
    """Tensor-parallel size of one copy (0 when it does not fit)."""
    pp: int
    """Pipeline stages of one copy (0 when it does not fit)."""
    replicas: int
    """Data-parallel copies of the model in the GPUs present."""
    expert_parallel: bool
    """MoE layers spread whole experts over the group."""
    summary: str
    """The answer in the lesson's words, e.g. "needs 3 GPU(s) -> TP=4, 2 replicas (DP)"."""


def round_up_power_of_two(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def choose_layout(d: Deployment) -> LayoutChoice:
    """Apply the lesson's rules to one deployment."""
    need = math.ceil(d.weights_gb / ((1 - d.kv_reserve) * d.gpu_memory_gb))
    group = round_up_power_of_two(need)
    if group > d.total_gpus:
        text = f"does not fit: {need} GPUs needed, {d.total_gpus} present"
        return LayoutChoice(need, group, False, 0, 0, 0, False, text)
    tp, pp, words = _split(group, d)
    replicas = d.total_gpus // group
    expert_parallel = d.moe and group > 1
    if replicas > 1:
        words += f", {replicas} replicas (DP)"
    if expert_parallel:
        words += ", expert parallel for the MoE layers"
    return LayoutChoice(need, group, True, tp, pp, replicas, expert_parallel, f"needs {need} GPU(s) -> {words}")


def _split(group: int, d: Deployment) -> tuple[int, int, str]:
    """(tp, pp, words) for one copy of ``group`` GPUs."""
    if group == 1:
        return 1, 1, "no split"
    if group <= d.gpus_per_node:
        if d.nvlink:
            return group, 1, f"TP={group}"
        return 1, group, f"PP={group} (PCIe: communicate once per stage)"
    pp = math.ceil(group / d.gpus_per_node)
    return d.gpus_per_node, pp, f"TP={d.gpus_per_node} inside a node, PP={pp} across nodes"
