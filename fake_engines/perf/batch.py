"""What one engine step contains and how the engine is laid out: the inputs of the step-time model.

The engine core builds a `StepBatch` for every step it schedules; `fake_engines.perf` turns it
into seconds. Neither side needs to know how the other works.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepBatch:
    """The work of one forward pass (one engine step)."""

    prefill_tokens: int = 0
    """Prompt tokens computed in this step, summed over all prefill chunks."""
    prefill_attended_tokens: int = 0
    """Attention work of the prefill chunks: for a chunk of n new tokens after c cached or
    earlier-computed tokens, n * c + n * (n + 1) / 2 query-key pairs, summed over chunks."""
    decode_seqs: int = 0
    """Sequences generating one token each in this step."""
    decode_context_tokens: int = 0
    """Sum over the decoding sequences of their context length (KV entries read per layer)."""
    lora_adapters: int = 0
    """Distinct LoRA adapters used by the step's requests."""

    @property
    def tokens(self) -> int:
        """Tokens in the forward pass: every prefill token plus one per decoding sequence."""
        return self.prefill_tokens + self.decode_seqs


@dataclass(frozen=True)
class Layout:
    """How one engine spreads over GPUs (vLLM's -tp/-pp/-dp/--enable-expert-parallel)."""

    tp: int = 1
    """Tensor-parallel size: every layer split over this many GPUs, two all-reduces per layer."""
    pp: int = 1
    """Pipeline-parallel size: layers cut into this many stages; pp batches in flight."""
    dp: int = 1
    """Data-parallel size: independent engine replicas (dense) or one MoE group of tp x dp GPUs."""
    ep: bool = False
    """Expert parallelism: MoE layers hold whole experts per GPU and exchange tokens all-to-all."""
    link: str = "nvlink"
    """Catalogue name of the link between the GPUs of one engine."""
    gpu_layer_fraction: float = 1.0
    """Share of the layers on GPUs (llama.cpp -ngl); the rest run on the CPU."""
    eager: bool = False
    """vLLM --enforce-eager: decode steps launch every kernel too, no CUDA-graph replay."""

    @property
    def world_size(self) -> int:
        """GPUs of one engine (ParallelConfig.world_size without context parallelism)."""
        return self.tp * self.pp
