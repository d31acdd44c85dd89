"""`fake-vllm serve` flags and settings: the vllm serve flags plus the look-alike's own (--gpu, --time-scale, ...).

The parser here is the one `fake-vllm serve` runs and the one the engine factory reads a fleet
group's command line with, so the same flags give the same config everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fake_engines.core import HASH_ALGOS
from flotilla.cli_errors import OneLineParser, port_number
from flotilla.errors import FlagError

AUTO_MAX_MODEL_LEN = -1
"""--max-model-len auto (or -1): the longest context the KV cache holds, up to the model's own."""


class ServeConfigError(FlagError):
    """A flag value the server cannot start with; the message names the flag."""


KV_EVENT_PUBLISHERS = ("null", "zmq")


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM 0.32's `KVEventsConfig` (vllm/config/kv_events.py): `--kv-events-config` JSON."""

    enable_kv_cache_events: bool = False
    """Record BlockStored / BlockRemoved / AllBlocksCleared as the KV cache changes."""
    publisher: str | None = None
    """"zmq" or "null"; None: "zmq" when events are enabled, else "null" (vLLM's __post_init__)."""
    endpoint: str = "tcp://*:5557"
    """PUB socket: a `*` host, `::`, ipc:// or inproc:// binds; any other host connects."""
    replay_endpoint: str | None = None
    """ROUTER socket answering replay requests (always bound); None: no replay."""
    buffer_steps: int = 10_000
    """Batches kept for replay."""
    hwm: int = 100_000
    """ZMQ high-water mark of the PUB socket (messages queued per subscriber before dropping)."""
    max_queue_size: int = 100_000
    """vLLM's bound on batches waiting for its publisher thread; validated, unused here (the
    look-alike sends on the event loop at once)."""
    topic: str = ""
    """First frame of every message; subscribers filter on its prefix."""

    def __post_init__(self) -> None:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        if self.publisher not in KV_EVENT_PUBLISHERS:
            raise ServeConfigError(f"--kv-events-config: publisher must be one of {', '.join(KV_EVENT_PUBLISHERS)}, "
                                   f"got {self.publisher!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            if getattr(self, name) < 1:
                raise ServeConfigError(f"--kv-events-config: {name} must be >= 1, got {getattr(self, name)}")

    @property
    def publishes(self) -> bool:
        """Whether events go out on ZMQ (enabled, with the zmq publisher)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def to_json(self) -> str:
        """The `--kv-events-config` value that gives this config."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """vLLM's `ZmqEventPublisher.offset_endpoint_port`: data-parallel rank r publishes on the
    tcp port + r (port 0 stays 0), on an inproc name + `_dp{r}`; rank 0 keeps the endpoint.
    ServeConfigError for another transport with r > 0, as vLLM's ValueError."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        if ":" not in endpoint:
            return endpoint
        base, _, port = endpoint.rpartition(":")
        try:
            base_port = int(port)
        except ValueError:
            raise ServeConfigError(f"--kv-events-config: endpoint {endpoint!r} has no port number") from None
        return endpoint if base_port == 0 else f"{base}:{base_port + data_parallel_rank}"
    raise ServeConfigError(f"--kv-events-config: endpoint {endpoint!r} with -dp > 1: "
                           "Invalid endpoint: must contain 'inproc' or 'tcp'")


_KV_EVENTS_TYPES: dict[str, tuple[type, ...]] = {
    "enable_kv_cache_events": (bool,), "publisher": (str, type(None)), "endpoint": (str,),
    "replay_endpoint": (str, type(None)), "buffer_steps": (int,), "hwm": (int,), "max_queue_size": (int,),
    "topic": (str,)}


def kv_events_config_of(value: str | dict[str, Any]) -> KVEventsConfig:
    """`--kv-events-config` JSON (or its decoded object) to a KVEventsConfig; ServeConfigError
    names the field that is unknown or of the wrong type, as vLLM's pydantic check refuses it."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ServeConfigError(f"--kv-events-config: not JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(value, dict):
        raise ServeConfigError("--kv-events-config: expected a JSON object")
    for name, item in value.items():
        if name not in _KV_EVENTS_TYPES:
            raise ServeConfigError(f"--kv-events-config: unknown field {name!r}; known: {', '.join(_KV_EVENTS_TYPES)}")
        kinds = _KV_EVENTS_TYPES[name]
        if not isinstance(item, kinds) or (isinstance(item, bool) and bool not in kinds):
            raise ServeConfigError(f"--kv-events-config: {name} must be {' or '.join(k.__name__ for k in kinds)}, "
                                   f"got {item!r}")
    return KVEventsConfig(**value)


def _kv_events_arg(text: str) -> KVEventsConfig:
    try:
        return kv_events_config_of(text)
    except ServeConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--kv-events-config: ")) from None


KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
"""vLLM 0.32's KVRole (vllm/config/kv_transfer.py)."""
KV_CONNECTORS = ("NixlConnector",)
"""Connectors the look-alike models; vLLM's others are refused by name."""
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")
DEFAULT_KV_LEASE_S = 30
"""NixlConnector's `kv_lease_duration` default (kv_connector_extra_config): seconds a prefill
engine holds a finished request's blocks for a decode engine to pull (vLLM 0.32's
base_scheduler.py; earlier releases had VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s)."""


@dataclass(frozen=True)
class KVTransferConfig:
    """vLLM 0.32's `KVTransferConfig` (vllm/config/kv_transfer.py): `--kv-transfer-config` JSON."""

    kv_connector: str | None = None
    """The connector: NixlConnector (the one the look-alike models)."""
    engine_id: str | None = None
    """This engine's id in transfers (`remote_engine_id`); None: a new uuid4, as vLLM."""
    kv_buffer_device: str = "cuda"
    """Where the connector buffers KV: cuda, cpu or xpu (no effect on the look-alike)."""
    kv_role: str | None = None
    """kv_producer, kv_consumer or kv_both; required with a connector. The NixlConnector plays
    each request's part from its kv_transfer_params whatever the role."""
    kv_port: int = 14579
    """The connector's port (NIXL's side channel is VLLM_NIXL_SIDE_CHANNEL_PORT instead)."""
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    """Connector options; the look-alike reads kv_lease_duration (seconds, default 30)."""
    kv_connector_module_path: str | None = None
    """A connector module to load (refused: the look-alike models NixlConnector only)."""
    enable_permute_local_kv: bool = False
    """vLLM's HND-to-NHD experiment flag (no effect)."""
    kv_load_failure_policy: str = "fail"
    """A pull that fails: fail the request (vLLM's default) or recompute the prompt locally."""

    def __post_init__(self) -> None:
        if self.engine_id is None:
            import uuid

            object.__setattr__(self, "engine_id", str(uuid.uuid4()))
        if self.kv_role is not None and self.kv_role not in KV_ROLES:
            raise ServeConfigError(f"--kv-transfer-config: Unsupported kv_role: {self.kv_role}. "
                                   f"Supported roles are {KV_ROLES}")
        if self.kv_connector is not None and self.kv_role is None:
            raise ServeConfigError("--kv-transfer-config: Please specify kv_role when kv_connector is set, "
                                   f"supported roles are {KV_ROLES}")
        if self.kv_connector is not None and self.kv_connector not in KV_CONNECTORS:
            raise ServeConfigError(f"--kv-transfer-config: kv_connector {self.kv_connector!r} is not modelled "
                                   f"by the look-alike; it models {', '.join(KV_CONNECTORS)}")
        if self.kv_connector_module_path is not None:
            raise ServeConfigError("--kv-transfer-config: kv_connector_module_path is not supported by the look-alike")
        if self.kv_load_failure_policy not in KV_LOAD_FAILURE_POLICIES:
            raise ServeConfigError(f"--kv-transfer-config: kv_load_failure_policy must be one of "
                                   f"{', '.join(KV_LOAD_FAILURE_POLICIES)}, got {self.kv_load_failure_policy!r}")
        lease = self.kv_connector_extra_config.get("kv_lease_duration", DEFAULT_KV_LEASE_S)
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) or lease <= 0:
            raise ServeConfigError(f"--kv-transfer-config: kv_connector_extra_config.kv_lease_duration must be "
                                   f"a positive number of seconds, got {lease!r}")

    @property
    def is_kv_transfer_instance(self) -> bool:
        """A connector and a role: this engine takes part in P/D transfers."""
        return self.kv_connector is not None and self.kv_role in KV_ROLES

    @property
    def kv_lease_s(self) -> float:
        """Seconds a prefill engine holds blocks for a pull before freeing them."""
        return float(self.kv_connector_extra_config.get("kv_lease_duration", DEFAULT_KV_LEASE_S))

    def to_json(self) -> str:
        """The `--kv-transfer-config` value that gives this config."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))


_KV_TRANSFER_TYPES: dict[str, tuple[type, ...]] = {
    "kv_connector": (str, type(None)), "engine_id": (str, type(None)), "kv_buffer_device": (str,),
    "kv_role": (str, type(None)), "kv_port": (int,), "kv_connector_extra_config": (dict,),
    "kv_connector_module_path": (str, type(None)), "enable_permute_local_kv": (bool,),
    "kv_load_failure_policy": (str,)}


def kv_transfer_config_of(value: str | dict[str, Any]) -> KVTransferConfig:
    """`--kv-transfer-config` JSON (or its decoded object) to a KVTransferConfig; ServeConfigError
    names the field that is unknown or of the wrong type, as vLLM's pydantic check refuses it."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ServeConfigError(f"--kv-transfer-config: not JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(value, dict):
        raise ServeConfigError("--kv-transfer-config: expected a JSON object")
    for name, item in value.items():
        if name not in _KV_TRANSFER_TYPES:
            raise ServeConfigError(f"--kv-transfer-config: unknown field {name!r}; known: {', '.join(_KV_TRANSFER_TYPES)}")
        kinds = _KV_TRANSFER_TYPES[name]
        if not isinstance(item, kinds) or (isinstance(item, bool) and bool not in kinds):
            raise ServeConfigError(f"--kv-transfer-config: {name} must be "
                                   f"{' or '.join(k.__name__ for k in kinds)}, got {item!r}")
    return KVTransferConfig(**value)


def _kv_transfer_arg(text: str) -> KVTransferConfig:
    try:
        return kv_transfer_config_of(text)
    except ServeConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--kv-transfer-config: ")) from None


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
    """Most running requests; None picks vLLM's default for the GPU (fake_engines.factory.vllm_engine)."""
    max_num_batched_tokens: int | None = None
    """Step token budget; None picks vLLM's default for the GPU."""
    max_model_len: int | None = None
    """Longest prompt + output, in tokens; None: the model's context length (vLLM's default, which
    the KV cache must hold or the engine refuses to start); -1 (`auto`): the longest the KV cache holds."""
    gpu_memory_utilization: float = 0.9
    """Share of GPU memory vLLM may use."""
    block_size: int | None = None
    """KV block size in tokens; None means vLLM's default of 16."""
    enable_prefix_caching: bool = True
    """Hash-chained prefix caching over full blocks."""
    async_scheduling: bool | None = None
    """--async-scheduling / --no-async-scheduling: vLLM's AsyncScheduler, the next step scheduled
    while this one runs. None is the look-alike's default, off (vLLM's on a GPU is on; why the
    look-alike differs: docs/fidelity.md, "Scheduler")."""
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
    kv_events_config: KVEventsConfig | None = None
    """--kv-events-config: publish KV cache events as vLLM does; None: no events."""
    kv_transfer_config: KVTransferConfig | None = None
    """--kv-transfer-config: take part in disaggregated prefill/decode (docs/pd.md); None: no connector."""
    kv_link: str = "ib400"
    """--kv-link: catalogue link a pulled KV cache crosses (fake_engines.perf.kv_transfer.KV_LINKS)."""
    gpu: str = "h100"
    """Catalogue GPU the look-alike pretends to run on."""
    link: str = "nvlink"
    """Catalogue link between the GPUs of one engine (tensor and pipeline traffic)."""
    catalogue: tuple[str, ...] = ()
    """Extra catalogue YAML files (models, GPUs, links) laid over the built-in one."""
    dtype: str = "bfloat16"
    """Weight dtype: bfloat16/float16 (16 bit), fp8/int8 (8 bit), float32."""
    kv_cache_dtype: str = "auto"
    """--kv-cache-dtype: the KV cache's element type; auto is the weights' (KV_CACHE_DTYPE_BYTES)."""
    enforce_eager: bool = False
    """--enforce-eager: no CUDA graphs, decode steps pay their kernel launches."""
    cpu_offload_gb: float = 0.0
    """--cpu-offload-gb: GiB of weights per GPU held in host memory (more KV cache, each step
    streams them over PCIe)."""
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
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                     "max_loras", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ServeConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks_override"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ServeConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.max_model_len is not None and self.max_model_len < 1 and self.max_model_len != AUTO_MAX_MODEL_LEN:
            raise ServeConfigError(f"--max-model-len must be >= 1, or auto (-1), got {self.max_model_len}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ServeConfigError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in ("time_scale", "load_gbps", "mean_output_tokens"):
            if not getattr(self, name) > 0:
                raise ServeConfigError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.async_scheduling and self.pipeline_parallel_size > 1:
            raise ServeConfigError("--async-scheduling with -pp > 1 is not modelled by the look-alike")
        if self.kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
            raise ServeConfigError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPE_BYTES)}, "
                                   f"got {self.kv_cache_dtype!r}")
        if self.cpu_offload_gb < 0:
            raise ServeConfigError(f"--cpu-offload-gb must be >= 0, got {self.cpu_offload_gb}")
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
        if isinstance(self.kv_events_config, dict):  # given in Python (a fleet's engine options)
            self.kv_events_config = kv_events_config_of(self.kv_events_config)
        if isinstance(self.kv_transfer_config, dict):  # given in Python (a fleet's engine options)
            self.kv_transfer_config = kv_transfer_config_of(self.kv_transfer_config)
        if self.kv_events_config is not None and self.kv_events_config.publishes:
            for rank in range(1, self.data_parallel_size):  # each rank's endpoints must exist
                offset_endpoint_port(self.kv_events_config.endpoint, rank)
                offset_endpoint_port(self.kv_events_config.replay_endpoint, rank)

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
              "float32": 32.0, "float": 32.0}
"""Bits per weight for each --dtype value."""

KV_CACHE_DTYPE_BYTES: dict[str, float | None] = {
    "auto": None, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0,
    "fp8_ds_mla": 1.0, "fp8_per_token_head": 1.0, "int8_per_token_head": 1.0, "nvfp4_ds_mla": 0.5,
    "int4_per_token_head": 0.5, "nvfp4": 0.5, "nvfp4_4over6": 0.5, "ultraquant_4bit": 0.5,
    "turboquant_k8v4": 0.75, "turboquant_4bit_nc": 0.5, "turboquant_k3v4_nc": 0.4375, "turboquant_3bit_nc": 0.375}
"""Bytes per KV element for each of vLLM 0.32's --kv-cache-dtype values (CacheDType in
vllm/config/cache.py); None: the weights' dtype. Per-block scales are left out (under 1 %)."""


def default_batch_limits(gpu_memory_gb: float, gpu_name: str) -> tuple[int, int]:
    """vLLM's OpenAI-server defaults (max_num_batched_tokens, max_num_seqs) for a GPU, before
    they are fitted to max_model_len (fake_engines.factory.vllm_engine.batch_limits).

    EngineArgs.get_batch_defaults for UsageContext.OPENAI_API_SERVER: >= 70 GiB of device memory
    and not an A100 gives 8192 / 1024, otherwise 2048 / 256."""
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


def max_model_len_arg(text: str) -> int:
    """argparse type of --max-model-len: tokens, or `auto` / -1 (vLLM's auto-fit)."""
    if text.strip().lower() in ("auto", "-1"):
        return AUTO_MAX_MODEL_LEN
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: tokens, or auto") from None


def build_parser(parser_class: type[argparse.ArgumentParser] = OneLineParser,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.ArgumentParser:
    """vLLM's serve flags (those a router or autoscaler can observe) plus the look-alike's own;
    `extra` adds the `serve` flags only the command line has (--print-config)."""
    parser = parser_class(prog="fake-vllm", description="Look-alike of `vllm serve`.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over the OpenAI API")
    serve.add_argument("model", help="a catalogue model name, or a Hugging Face id or path naming one "
                                     "(meta-llama/Llama-3.1-8B-Instruct; the catalogue's rule: docs/fidelity.md)")
    serve.add_argument("--served-model-name", nargs="+", default=None,
                       help="the name(s) clients use; default MODEL as given")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=port_number, default=8000, help="TCP port; 0 picks a free one")
    serve.add_argument("--api-key", default=None, help="bearer token required on /v1 routes")
    serve.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, help="GPUs splitting every layer")
    serve.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1, help="pipeline stages")
    serve.add_argument("-dp", "--data-parallel-size", type=int, default=1, help="engine replicas behind this server")
    serve.add_argument("-ep", "--enable-expert-parallel", action="store_true",
                       help="MoE layers hold whole experts per GPU")
    serve.add_argument("--max-num-seqs", type=int, default=None, help="most running requests; default vLLM's for the GPU")
    serve.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="step token budget; default vLLM's for the GPU")
    serve.add_argument("--max-model-len", type=max_model_len_arg, default=None,
                       help="tokens; default the model's context length; auto (-1): what the KV cache holds")
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--block-size", type=int, default=None)
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    serve.add_argument("--prefix-caching-hash-algo", choices=tuple(HASH_ALGOS), default="sha256")
    serve.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                       help="schedule the next step while this one runs (vLLM's AsyncScheduler); "
                            "the look-alike's default is off")
    serve.add_argument("--num-gpu-blocks-override", type=int, default=None)
    serve.add_argument("--enable-lora", action="store_true")
    serve.add_argument("--max-loras", type=int, default=1)
    serve.add_argument("--max-lora-rank", type=int, default=16)
    serve.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH")
    serve.add_argument("--enable-prompt-tokens-details", action="store_true",
                       help="report usage.prompt_tokens_details.cached_tokens")
    serve.add_argument("--kv-cache-dtype", choices=tuple(KV_CACHE_DTYPE_BYTES), default="auto",
                       help="KV cache element type; fp8 holds twice the tokens of bfloat16 and reads half the bytes")
    serve.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False,
                       help="no CUDA graphs: decode steps pay every kernel launch")
    serve.add_argument("--cpu-offload-gb", type=float, default=0.0,
                       help="GiB of weights per GPU kept in host memory: more KV cache, and every step "
                            "streams them over PCIe")
    serve.add_argument("--kv-events-config", type=_kv_events_arg, default=None, metavar="JSON",
                       help='vLLM\'s KVEventsConfig, e.g. {"enable_kv_cache_events": true, "publisher": "zmq", '
                            '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}')
    serve.add_argument("--kv-transfer-config", type=_kv_transfer_arg, default=None, metavar="JSON",
                       help='vLLM\'s KVTransferConfig for disaggregated prefill/decode, e.g. '
                            '{"kv_connector": "NixlConnector", "kv_role": "kv_both"} (docs/pd.md)')
    from fake_engines.driver.faults import add_fault_arguments

    add_fault_arguments(serve)
    _add_look_alike_arguments(serve)
    if extra is not None:
        extra(serve)
    from fake_engines.factory.upstream import add_upstream_flags
    from fake_engines.vllm.upstream_flags import FLAGS

    # `--model` stays the positional MODEL; -h is argparse's own
    add_upstream_flags(serve, FLAGS, "vllm serve 0.32.0 flags accepted without effect", skip=("--model",))
    # vLLM's FlexibleArgumentParser reads -O3 as --optimization-level 3 and -O.x=y as --compilation-config
    serve._action_groups[-1].add_argument("-O", dest="upstream_O", metavar="LEVEL|.KEY=VALUE", default=None,
                                          help="compilation level or config (accepted; no effect on the look-alike)")
    return parser


def _add_look_alike_arguments(serve: argparse.ArgumentParser) -> None:
    look = serve.add_argument_group("look-alike")
    look.add_argument("--gpu", default="h100", help="catalogue GPU name")
    look.add_argument("--link", default="nvlink", help="catalogue link between the engine's GPUs")
    look.add_argument("--catalogue", action="append", default=[], metavar="FILE", help="extra catalogue YAML")
    look.add_argument("--kv-link", default="ib400",
                      help="catalogue link a KV cache pulled from a prefill engine crosses (nvlink, ib400, "
                           "roce400, pcie5, pcie4, eth100; default ib400)")
    look.add_argument("--dtype", default="bfloat16")
    look.add_argument("--time-scale", type=float, default=1.0, help="0.01 runs 100x faster than modelled")
    look.add_argument("--seed", type=int, default=0)
    look.add_argument("--load-gbps", type=float, default=5.0, help="weight loading bandwidth, GB/s")
    look.add_argument("--startup-seconds", type=float, default=5.0,
                      help="process start-up before weights load, modelled seconds")
    look.add_argument("--warmup-seconds", type=float, default=10.0,
                      help="CUDA-graph capture and compile after loading, modelled seconds")
    look.add_argument("--mean-output-tokens", type=float, default=128.0,
                      help="mean output length before EOS when a request does not ignore it")
    shape = serve.add_argument_group("explicit model shape (instead of a catalogue model)")
    shape.add_argument("--params", type=float, help="parameters, all experts included, e.g. 8.03e9")
    for name in SHAPE_FLAGS[1:]:
        shape.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"config.json {SHAPE_HELP[name]}")


SHAPE_FLAGS = ("params", "layers", "kv_heads", "head_dim", "hidden", "heads", "intermediate", "vocab")
SHAPE_HELP = {"layers": "num_hidden_layers", "kv_heads": "num_key_value_heads", "head_dim": "head_dim (default 128)",
              "hidden": "hidden_size", "heads": "num_attention_heads", "intermediate": "intermediate_size",
              "vocab": "vocab_size"}


def _shape(args: argparse.Namespace) -> dict[str, float] | None:
    shape = {name: getattr(args, name) for name in SHAPE_FLAGS if getattr(args, name) is not None}
    return shape or None


def config_from_args(args: argparse.Namespace) -> VllmServeConfig:
    """Flags to a validated VllmServeConfig."""
    return VllmServeConfig(
        model=args.model, model_shape=_shape(args), served_model_name=args.served_model_name[0] if args.served_model_name else None,
        host=args.host, port=args.port, api_key=args.api_key, tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size, data_parallel_size=args.data_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching, async_scheduling=args.async_scheduling,
        prefix_caching_hash_algo=args.prefix_caching_hash_algo, num_gpu_blocks_override=args.num_gpu_blocks_override,
        enable_lora=args.enable_lora, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
        lora_modules=parse_lora_modules(args.lora_modules),
        enable_prompt_tokens_details=args.enable_prompt_tokens_details, kv_events_config=args.kv_events_config,
        kv_cache_dtype=args.kv_cache_dtype, enforce_eager=args.enforce_eager, cpu_offload_gb=args.cpu_offload_gb,
        kv_transfer_config=args.kv_transfer_config, kv_link=args.kv_link, gpu=args.gpu, link=args.link,
        catalogue=tuple(args.catalogue), dtype=args.dtype, time_scale=args.time_scale, seed=args.seed,
        load_gbps=args.load_gbps, startup_s=args.startup_seconds, warmup_s=args.warmup_seconds,
        mean_output_tokens=args.mean_output_tokens)


OPTION_FLAGS: dict[str, str] = {"startup_s": "--startup-seconds", "warmup_s": "--warmup-seconds"}
"""Config fields whose flag is not `--` plus the field name with dashes (fake_engines.factory.option_flags)."""
