"""Which device holds each layer under llama.cpp's layer split mode (-ngl, -ts, free memory).

Mirrors the split-point code of ``llama_model_base::load_tensors`` (src/llama-model.cpp): the
proportions become normalized running sums, the output layer counts as layer ``n_layer``, only the
last ``-ngl`` units go to GPUs, and each GPU unit goes to the first device whose running sum is
above ``(il - first_gpu_layer) / gpu_layers`` (``std::upper_bound``). The C++ does this in
``float``, so the arithmetic here is ``numpy.float32``: a double would move boundary layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fake_engines.perf.batch import Layout

CPU = "CPU"


@dataclass(frozen=True)
class LayerRange:
    """A run of consecutive repeating layers on one device."""

    device: str
    """"CPU" or "GPU<i>" (i = index in the device list)."""
    first_layer: int
    """Index of the first layer of the run (0-based)."""
    last_layer: int
    """Index of the last layer of the run (inclusive)."""

    @property
    def layers(self) -> int:
        """Number of layers in the run."""
        return self.last_layer - self.first_layer + 1

    def describe(self) -> str:
        return f"{self.device} layers {self.first_layer}-{self.last_layer} ({self.layers})"


@dataclass(frozen=True)
class LlamaCppSplit:
    """Where llama.cpp puts each layer of a model with ``n_layer`` repeating layers."""

    n_layer: int
    """Repeating (transformer) layers of the model."""
    gpus: int
    """GPU devices that take part in the split."""
    devices: tuple[str, ...]
    """Device of each unit: entries 0..n_layer-1 are the repeating layers, entry n_layer the output layer."""
    split_points: tuple[float, ...]
    """Normalized running sums of the proportions, one per GPU taking part (float32 values, last 1.0)."""

    @property
    def output_device(self) -> str:
        """Device of the output layer (final norm and token-score projection)."""
        return self.devices[self.n_layer]

    @property
    def ranges(self) -> tuple[LayerRange, ...]:
        """Runs of consecutive repeating layers on the same device, in layer order."""
        runs: list[LayerRange] = []
        start = 0
        for il in range(1, self.n_layer + 1):
            if il < self.n_layer and self.devices[il] == self.devices[start]:
                continue
            runs.append(LayerRange(self.devices[start], start, il - 1))
            start = il
        return tuple(runs)

    @property
    def layers_per_gpu(self) -> tuple[int, ...]:
        """Repeating layers held by each GPU (the output layer is not counted)."""
        layers = self.devices[: self.n_layer]
        return tuple(layers.count(f"GPU{g}") for g in range(self.gpus))

    @property
    def cpu_layers(self) -> int:
        """Repeating layers left on the CPU."""
        return self.devices[: self.n_layer].count(CPU)

    @property
    def gpu_layer_fraction(self) -> float:
        """Share of the repeating layers on GPUs, in [0, 1]."""
        return (self.n_layer - self.cpu_layers) / self.n_layer if self.n_layer else 0.0

    @property
    def gpus_used(self) -> int:
        """GPUs that hold at least one layer or the output layer."""
        return len({d for d in self.devices if d != CPU})

    def engine_layout(self, link: str = "pcie4") -> Layout:
        """The step-time model's view: one stage per GPU used, the CPU share via gpu_layer_fraction.

        llama.cpp decodes one batch at a time, so its step is the one-batch time through all
        stages (``step_time_s``), not the interval between batches of a filled pipeline.
        """
        return Layout(pp=max(self.gpus_used, 1), link=link, gpu_layer_fraction=self.gpu_layer_fraction)

    def describe(self) -> str:
        """One line as the lesson prints it: ranges, then where the output layer is."""
        return ", ".join(r.describe() for r in self.ranges) + f", output on {self.output_device}"


def split_points(proportions: Sequence[float]) -> np.ndarray:
    """Normalized running sums of the per-GPU proportions, in float32 as llama.cpp computes them."""
    points = np.zeros(len(proportions), dtype=np.float32)
    total = np.float32(0.0)
    for i, share in enumerate(proportions):
        total = np.float32(total + np.float32(share))
        points[i] = total
    if not total > 0:
        raise ValueError(f"proportions must have a positive sum, got {list(proportions)}")
    return points / total


def assign_layers(n_layer: int, n_gpu_layers: int, proportions: Sequence[float]) -> LlamaCppSplit:
    """Place every layer as llama.cpp does for ``-ngl n_gpu_layers -sm layer -ts proportions``.

    ``proportions`` has one entry per GPU: the -ts values, or each GPU's free memory when -ts is
    not given (see ``proportions_from_free_memory``). A negative ``n_gpu_layers`` means all layers.
    No GPUs (empty ``proportions``) keeps everything on the CPU.
    """
    if n_layer < 1:
        raise ValueError(f"n_layer must be >= 1, got {n_layer}")
    if any(p < 0 for p in proportions):
        raise ValueError(f"proportions must be >= 0, got {list(proportions)}")
    gpus = len(proportions)
    if n_gpu_layers < 0:
        n_gpu_layers = n_layer + 1
    points = split_points(proportions) if gpus else np.zeros(0, dtype=np.float32)
    first_gpu = max(n_layer + 1 - n_gpu_layers, 0)
    gpu_units = min(n_gpu_layers, n_layer + 1) if gpus else 0
    devices = tuple(_device_of(il, first_gpu, gpu_units, points) for il in range(n_layer + 1))
    return LlamaCppSplit(n_layer, gpus, devices, tuple(float(p) for p in points))


def assign_layers_single_gpu(n_layer: int, n_gpu_layers: int, main_gpu: int, gpus: int) -> LlamaCppSplit:
    """Place every layer for ``-sm none -mg main_gpu``: only the main GPU joins, -ts is ignored."""
    if not 0 <= main_gpu < gpus:
        raise ValueError(f"main_gpu must be in [0, {gpus}), got {main_gpu}")
    one = assign_layers(n_layer, n_gpu_layers, [1.0])
    devices = tuple(d if d == CPU else f"GPU{main_gpu}" for d in one.devices)
    return LlamaCppSplit(n_layer, gpus, devices, one.split_points)


def _device_of(il: int, first_gpu: int, gpu_units: int, points: np.ndarray) -> str:
    if il < first_gpu or il - first_gpu >= gpu_units:
        return CPU
    x = np.float32(il - first_gpu) / np.float32(gpu_units)
    return f"GPU{int(np.searchsorted(points, x, side='right'))}"  # side='right' is std::upper_bound


def proportions_from_free_memory(free_bytes: Sequence[float]) -> tuple[float, ...]:
    """The default proportions when -ts is absent (or all zero): each GPU's free memory at load time."""
    return tuple(float(np.float32(b)) for b in free_bytes)  # size_t stored into a float, as in the C++


def resolve_proportions(tensor_split: Sequence[float] | None, free_bytes: Sequence[float] | None) -> tuple[float, ...]:
    """-ts wins unless it is absent or all zero; then each GPU's free memory decides (llama.cpp's rule)."""
    if tensor_split and any(t != 0 for t in tensor_split):
        return tuple(float(t) for t in tensor_split)
    if free_bytes is None:
        raise ValueError("free_bytes is required when tensor_split is absent or all zero")
    return proportions_from_free_memory(free_bytes)
