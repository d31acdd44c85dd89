"""`fake-llama-server` settings: llama-server's flags plus the look-alike's own."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

BUILD_INFO = "b1-0c1e570"
"""The llama.cpp build the look-alike answers as (system_fingerprint, /props build_info)."""

SPLIT_MODES = ("none", "layer", "row", "tensor")


class ServerConfigError(ValueError):
    """A flag value llama-server would refuse; the message names the flag."""


@dataclass
class LlamaServerConfig:
    """Everything `fake-llama-server` is started with."""

    model: str
    """-m: a GGUF path, or <catalogue-model>-<QUANT>.gguf."""
    alias: str | None = None
    """-a: the model id clients see; defaults to -m as given."""
    n_ctx: int = 4096
    """-c: KV cells in tokens, shared by all slots."""
    n_parallel: int = -1
    """-np: slots; -1 is auto (4 slots, unified KV)."""
    n_gpu_layers: int = -1
    """-ngl: layers on GPUs; -1 means all."""
    split_mode: str = "layer"
    """-sm: none, layer, row or tensor."""
    tensor_split: list[float] = field(default_factory=list)
    """-ts: share of layers per GPU; its length is the GPU count (1 when empty)."""
    main_gpu: int = 0
    """-mg: the GPU used with -sm none."""
    n_batch: int = 2048
    """-b: logical batch."""
    n_ubatch: int = 512
    """-ub: physical batch."""
    loras: list[tuple[str, float]] = field(default_factory=list)
    """--lora / --lora-scaled: adapter paths with their global scales, ids in order."""
    warmup: bool = True
    """False with --no-warmup."""
    metrics: bool = False
    """--metrics: serve /metrics (501 otherwise)."""
    slots: bool = True
    """False with --no-slots: /slots answers 501."""
    slot_prompt_similarity: float = 0.10
    """--slot-prompt-similarity: least common-prefix share to pick a slot by its cache."""
    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = 8080
    """TCP port; 0 picks a free one."""
    api_key: str | None = None
    """Bearer token required on all but the public routes."""
    gpu: str = "h100"
    """Catalogue GPU the look-alike pretends to run on."""
    time_scale: float = 1.0
    """Multiply every modelled duration by this."""
    seed: int = 0
    """Seeds generated text and output lengths."""
    load_gbps: float = 5.0
    """Weight loading bandwidth, GB/s."""
    startup_s: float = 0.5
    """Process start-up before loading (modelled seconds)."""
    mean_output_tokens: float = 128.0
    """Mean output length before EOS."""

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch"):
            if getattr(self, name) < 1:
                raise ServerConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.n_parallel == 0 or self.n_parallel < -1:
            raise ServerConfigError(f"-np must be >= 1 or -1 (auto), got {self.n_parallel}")
        if self.split_mode not in SPLIT_MODES:
            raise ServerConfigError(f"-sm must be one of {', '.join(SPLIT_MODES)}, got {self.split_mode!r}")
        if not 0.0 <= self.slot_prompt_similarity <= 1.0:
            raise ServerConfigError(f"--slot-prompt-similarity must be in [0, 1], got {self.slot_prompt_similarity}")
        if not 0 <= self.main_gpu < self.num_gpus:
            raise ServerConfigError(f"-mg must be in [0, {self.num_gpus}), got {self.main_gpu}")
        if self.time_scale <= 0 or self.load_gbps <= 0:
            raise ServerConfigError("--time-scale and --load-gbps must be > 0")

    @property
    def num_gpus(self) -> int:
        """GPUs the server sees: one per -ts entry, else one."""
        return max(len(self.tensor_split), 1)

    @property
    def model_id(self) -> str:
        """The id /v1/models and responses report."""
        return self.alias or self.model


def parse_tensor_split(text: str | None) -> list[float]:
    """-ts 3,1 (or 3/1) into proportions."""
    if not text:
        return []
    try:
        return [float(part) for part in re.split(r"[,/]", text) if part]
    except ValueError:
        raise ServerConfigError(f"-ts expects numbers separated by ',' or '/', got {text!r}") from None

