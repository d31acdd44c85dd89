"""What vLLM's -tp -pp -dp --enable-expert-parallel mean in GPUs, engines and MoE grouping.

Three rules from the vLLM source: one engine uses pp x tp GPUs (``ParallelConfig.world_size``
without context parallelism); the deployment uses that times dp (``world_size_across_dp``); MoE
layers flatten tp across dp into one group of tp x dp GPUs (``FusedMoEParallelConfig.make``),
which splits every expert that many ways, or with expert parallelism spreads whole experts.
"""

from __future__ import annotations

from dataclasses import dataclass

from fake_engines.perf.batch import Layout


@dataclass(frozen=True)
class VllmLayout:
    """A vLLM parallel configuration and what it adds up to."""

    tp: int = 1
    """--tensor-parallel-size: GPUs that split every layer of one pipeline stage."""
    pp: int = 1
    """--pipeline-parallel-size: pipeline stages of one engine."""
    dp: int = 1
    """--data-parallel-size: engines (replicas of attention, one scheduler each)."""
    enable_expert_parallel: bool = False
    """--enable-expert-parallel: MoE layers hold whole experts instead of a slice of each."""
    moe: bool = False
    """The model has expert (MoE) layers; dense models ignore the expert flags."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def world_size(self) -> int:
        """GPUs of one engine: pp x tp."""
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        """GPUs of the whole deployment: world size x dp."""
        return self.world_size * self.dp

    @property
    def engines(self) -> int:
        """Engine processes, each with its own scheduler: one per data-parallel rank."""
        return self.dp

    @property
    def moe_group(self) -> int:
        """GPUs that share each MoE layer: tp flattened across dp (0 for a dense model)."""
        return self.tp * self.dp if self.moe else 0

    @property
    def expert_parallel(self) -> bool:
        """Whole experts per GPU: only with the flag, an MoE model and a group of more than one GPU."""
        return self.moe and self.enable_expert_parallel and self.moe_group > 1

    @property
    def experts_per_gpu_fraction(self) -> float:
        """Share of each MoE layer's expert weights on one GPU (1.0 for a dense model)."""
        return 1.0 / self.moe_group if self.moe else 1.0

    def flags(self) -> str:
        """The vllm serve flags of this layout, in the lesson's short form."""
        text = f"-tp {self.tp}"
        text += f" -pp {self.pp}" if self.pp > 1 else ""
        text += f" -dp {self.dp}" if self.dp > 1 else ""
        return text + (" --enable-expert-parallel" if self.enable_expert_parallel else "")

    def expert_layers(self) -> str:
        """How the expert layers are spread, in the lesson's words."""
        if not self.moe:
            return "no expert layers"
        group = self.moe_group
        if self.expert_parallel:
            return f"EP={group}: each GPU holds 1/{group} of the experts"
        return f"TP={group}: every expert split {group} ways"

    def engine_layout(self, link: str = "nvlink") -> Layout:
        """The step-time model's view of one engine of this deployment."""
        return Layout(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.expert_parallel, link=link)
