"""`fake-vllm serve` settings: the vllm serve flags plus the look-alike's own (--gpu, --time-scale, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fake_engines.core import HASH_ALGOS

VLLM_VERSION = "0.32.0"
"""The vLLM release the look-alike answers as (/version, system_fingerprint)."""


class ServeConfigError(ValueError):
    """A flag value the server cannot start with; the message names the flag."""


@dataclass
class VllmServeConfig:
    """Everything `fake-vllm serve` is started with."""

    model: str
    """Catalogue model name (llama-3.1-8b, ...), a path whose last part names one, or any name with model_shape."""
    model_shape: dict[str, float] | None = None
    """Explicit shape instead of a catalogue entry: params, layers, kv_heads (required), head_dim, hidden,
    heads, intermediate, vocab (the `flotilla plan` shape flags)."""
    served_model_name: str | None = None
    """Name clients use; defaults to `model` as given."""
    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = 8000
    """TCP port to bind; 0 picks a free one."""
    api_key: str | None = None
    """Bearer token required on /v1 routes when set."""
    tensor_parallel_size: int = 1
    """-tp: GPUs splitting every layer."""
    pipeline_parallel_size: int = 1
    """-pp: pipeline stages."""
    data_parallel_size: int = 1
    """-dp: engine replicas behind this server."""
    enable_expert_parallel: bool = False
    """MoE layers hold whole experts per GPU."""
    max_num_seqs: int | None = None
    """Most running requests; None picks vLLM's default for the GPU (1024 on >= 70 GiB non-A100, else 256)."""
    max_num_batched_tokens: int | None = None
    """Step token budget; None picks vLLM's default for the GPU (8192, else 2048)."""
    max_model_len: int = 8192
    """Longest prompt + output, in tokens."""
    gpu_memory_utilization: float = 0.9
    """Share of GPU memory vLLM may use."""
    block_size: int | None = None
    """KV block size in tokens; None means vLLM's default of 16."""
    enable_prefix_caching: bool = True
    """Hash-chained prefix caching over full blocks."""
    prefix_caching_hash_algo: str = "sha256"
    """Block hash: sha256 (vLLM's default) or builtin (Python's tuple hash, vLLM's earlier default)."""
    num_gpu_blocks_override: int | None = None
    """KV blocks to use instead of the capacity model's figure."""
    enable_lora: bool = False
    """Serve LoRA adapters."""
    max_loras: int = 1
    """Distinct adapters in one step."""
    max_lora_rank: int = 16
    """Largest adapter rank."""
    lora_modules: dict[str, str] = field(default_factory=dict)
    """Adapters loaded at start: name -> path."""
    enable_prompt_tokens_details: bool = False
    """Report usage.prompt_tokens_details.cached_tokens."""
    gpu: str = "h100"
    """Catalogue GPU the look-alike pretends to run on."""
    dtype: str = "bfloat16"
    """Weight dtype: bfloat16/float16 (16 bit), fp8/int8 (8 bit), float32."""
    time_scale: float = 1.0
    """Multiply every modelled duration by this (0.01 runs 100x faster)."""
    seed: int = 0
    """Seeds generated text and output lengths."""
    load_gbps: float = 5.0
    """Weight loading bandwidth in GB/s, for the cold start."""
    startup_s: float = 5.0
    """Process start-up before weights load (modelled seconds)."""
    warmup_s: float = 10.0
    """CUDA-graph capture and compile after loading (modelled seconds)."""
    mean_output_tokens: float = 128.0
    """Mean output length before EOS when the client sets no ignore_eos."""

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_model_len",
                     "max_loras", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ServeConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks_override"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ServeConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ServeConfigError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.time_scale <= 0:
            raise ServeConfigError(f"--time-scale must be > 0, got {self.time_scale}")
        if self.load_gbps <= 0:
            raise ServeConfigError(f"--load-gbps must be > 0, got {self.load_gbps}")
        if self.dtype not in DTYPE_BITS:
            raise ServeConfigError(f"--dtype must be one of {sorted(DTYPE_BITS)}, got {self.dtype!r}")
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ServeConfigError(f"--prefix-caching-hash-algo must be one of {', '.join(HASH_ALGOS)}, "
                                   f"got {self.prefix_caching_hash_algo!r}")
        if self.model_shape is not None:
            missing = [k for k in ("params", "layers", "kv_heads") if not self.model_shape.get(k)]
            if missing:
                raise ServeConfigError(f"an explicit model shape needs {', '.join('--' + m.replace('_', '-') for m in missing)}")
        if self.lora_modules and not self.enable_lora:
            raise ServeConfigError("--lora-modules needs --enable-lora")

    @property
    def model_name(self) -> str:
        """The first served name: what /v1/models lists and every metric's model_name label."""
        return self.served_model_name or self.model

    @property
    def weight_bits(self) -> float:
        """Bits per weight for --dtype."""
        return DTYPE_BITS[self.dtype]

    @property
    def resolved_block_size(self) -> int:
        """--block-size or vLLM's default."""
        return self.block_size or 16


DTYPE_BITS = {"auto": 16.0, "bfloat16": 16.0, "float16": 16.0, "half": 16.0, "fp8": 8.0, "int8": 8.0,
              "float32": 32.0}
"""Bits per weight for each --dtype value."""


def default_batch_limits(gpu_memory_gb: float, gpu_name: str) -> tuple[int, int]:
    """vLLM's OpenAI-server defaults (max_num_batched_tokens, max_num_seqs) for a GPU.

    get_batch_defaults: >= 70 GiB and not an A100 gives 8192 / 1024, otherwise 2048 / 256."""
    gib = gpu_memory_gb * 1e9 / 2**30
    if gib >= 70 and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


def parse_lora_modules(items: list[str]) -> dict[str, str]:
    """--lora-modules name=path [name=path ...] into a mapping."""
    modules: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ServeConfigError(f"--lora-modules expects name=path, got {item!r}")
        modules[name] = path
    return modules
