"""LoRA adapter memory: adapter size per rank, vLLM's reserved adapter buffers, merged vs shared.

A LoRA adapter adds A (r x in) and B (out x r) to each adapted module, r x (in + out) parameters.
vLLM allocates its GPU adapter buffers for ``--max-loras`` adapters at ``--max-lora-rank``
(``create_lora_weights`` in vllm/lora/layers/base_linear.py): the reservation follows the flags,
not the adapters loaded, and the KV cache does not get that memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BF16_BYTES = 2
"""Bytes per adapter parameter: adapters are served in the model's activation dtype, BF16 here."""

LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The seven projection matrices of a Llama-style layer, in PEFT's names."""

_MLP = ("gate_proj", "up_proj", "down_proj")
_ROW_PARALLEL = ("o_proj", "down_proj")


@dataclass(frozen=True)
class AdaptedModule:
    """One linear layer of a transformer layer that an adapter modifies."""

    name: str
    """PEFT target-module name, e.g. "q_proj"."""
    in_features: int
    """Inputs of the linear layer."""
    out_features: int
    """Outputs of the linear layer."""
    copies: int = 1
    """Instances per layer adapted separately: the experts of an MoE layer, else 1."""

    @property
    def params_per_rank(self) -> int:
        """Adapter parameters per unit of rank: (in + out) for every copy."""
        return self.copies * (self.in_features + self.out_features)

    def params_per_rank_per_gpu(self, tp: int) -> float:
        """Share of ``params_per_rank`` one of ``tp`` tensor-parallel GPUs holds.

        vLLM shards the side the base layer shards: B's outputs for column-parallel layers,
        A's inputs for row-parallel ones (o_proj, down_proj); the other matrix is replicated.
        """
        if self.name in _ROW_PARALLEL:
            return self.copies * (self.in_features / tp + self.out_features)
        return self.copies * (self.in_features + self.out_features / tp)


@dataclass(frozen=True)
class LoraShape:
    """The adapted modules of one layer and the number of layers."""

    modules: tuple[AdaptedModule, ...]
    """Adapted modules of one transformer layer."""
    layers: int
    """Transformer layers, each adapted the same way."""

    @property
    def params_per_rank_per_layer(self) -> int:
        """Adapter parameters per unit of rank in one layer."""
        return sum(m.params_per_rank for m in self.modules)

    def adapter_params(self, rank: int) -> int:
        """Parameters of one adapter of this rank over all layers."""
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        return rank * self.params_per_rank_per_layer * self.layers

    def adapter_bytes(self, rank: int, dtype_bytes: int = BF16_BYTES) -> int:
        """Memory of one adapter of this rank."""
        return self.adapter_params(rank) * dtype_bytes


def llama_modules(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                  targets: Sequence[str] = LLAMA_MODULES, experts: int = 0) -> tuple[AdaptedModule, ...]:
    """The projections of a Llama-shaped layer (grouped-query attention, gated MLP) named in ``targets``.

    With ``experts`` > 0 the MLP projections exist once per expert (``intermediate`` is per
    expert) and each copy gets its own adapter, as vLLM's MoE LoRA layers hold one per expert.
    """
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    shapes = {
        "q_proj": (hidden, q_out), "k_proj": (hidden, kv_out), "v_proj": (hidden, kv_out),
        "o_proj": (q_out, hidden), "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate), "down_proj": (intermediate, hidden),
    }
    unknown = [t for t in targets if t not in shapes]
    if unknown:
        raise ValueError(f"targets has unknown modules {unknown}; known: {', '.join(LLAMA_MODULES)}")
    mlp_copies = max(experts, 1)
    return tuple(AdaptedModule(t, *shapes[t], mlp_copies if t in _MLP else 1) for t in targets)


def vllm_adapter_buffer_bytes(shape: LoraShape, max_loras: int, max_lora_rank: int,
                              dtype_bytes: int = BF16_BYTES) -> int:
    """GPU memory vLLM reserves for adapter weights: max_loras slots, each at max_lora_rank."""
    _check_slots(max_loras, max_lora_rank)
    return max_loras * shape.adapter_bytes(max_lora_rank, dtype_bytes)


def vllm_adapter_buffer_bytes_per_gpu(shape: LoraShape, max_loras: int, max_lora_rank: int, tp: int,
                                      dtype_bytes: int = BF16_BYTES) -> float:
    """The reservation on each of ``tp`` GPUs: memory the KV cache of that GPU does not get."""
    _check_slots(max_loras, max_lora_rank)
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    per_layer = sum(m.params_per_rank_per_gpu(tp) for m in shape.modules)
    return max_loras * max_lora_rank * per_layer * shape.layers * dtype_bytes


@dataclass(frozen=True)
class LoraStepCost:
    """What adapters add to a step that uses them, on one GPU (vLLM's punica-style LoRA kernels).

    Each adapted linear layer runs a shrink (x A^T, r x in) and an expand (B^T, out x r) next to
    the base matmul: 2 r (in + out) FLOPs per token, and each distinct adapter of the step has its
    A and B read once. vLLM keeps adapters in buffers of `--max-lora-rank` and its kernels run at
    that rank, so `rank` is the flag, not the adapter's own. The FLOPs are counted for every token
    of a step with an adapter (an upper bound: the kernels skip tokens of the base model)."""

    shape: LoraShape
    """The adapted modules and layers."""
    rank: int
    """Rank the kernels run at (vLLM's --max-lora-rank)."""
    tp: int = 1
    """Tensor-parallel GPUs sharing each layer (the sharded side of A or B)."""
    dtype_bytes: int = BF16_BYTES
    """Bytes per adapter weight."""

    @property
    def params_per_gpu(self) -> float:
        """Adapter parameters of one adapter one GPU holds, all layers."""
        return self.rank * sum(m.params_per_rank_per_gpu(self.tp) for m in self.shape.modules) * self.shape.layers

    def weight_bytes(self, adapters: int) -> float:
        """Adapter weight bytes one GPU reads in a step using `adapters` distinct adapters."""
        return adapters * self.params_per_gpu * self.dtype_bytes

    def flops(self, tokens: int) -> float:
        """Adapter FLOPs one GPU does for `tokens` tokens."""
        return 2.0 * tokens * self.params_per_gpu


def _check_slots(max_loras: int, max_lora_rank: int) -> None:
    if max_loras < 1 or max_lora_rank < 1:
        raise ValueError(f"max_loras and max_lora_rank must be >= 1, got {max_loras}, {max_lora_rank}")


@dataclass(frozen=True)
class TenantMemory:
    """Memory to serve many fine-tuned variants of one base model."""

    tenants: int
    """Fine-tuned variants served."""
    merged_bytes: float
    """Each variant merged into its own full copy of the model."""
    shared_bytes: float
    """One base model plus one adapter per variant."""


def tenant_memory(shape: LoraShape, base_bytes: float, tenants: int, rank: int,
                  dtype_bytes: int = BF16_BYTES) -> TenantMemory:
    """Merged models versus one base model shared by per-tenant adapters of ``rank``."""
    if tenants < 0:
        raise ValueError(f"tenants must be >= 0, got {tenants}")
    merged = tenants * base_bytes
    shared = base_bytes + tenants * shape.adapter_bytes(rank, dtype_bytes)
    return TenantMemory(tenants, merged, shared)
