"""`fake-llama-server` flags and settings: llama-server's flags plus the look-alike's own.

The parser here is the one `fake-llama-server` runs and the one the engine factory reads a fleet
group's command line with, so the same flags give the same config everywhere.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from fake_engines.factory import llamacpp_chat_flags as chat_flags
from fake_engines.factory import llamacpp_http_flags as http_flags
from fake_engines.factory import llamacpp_pooling_flags as pooling_flags
from fake_engines.factory import llamacpp_tools_flags as tools_flags
from flotilla.cli_errors import OneLineParser, port_number
from flotilla.errors import FlagError

SPLIT_MODES = ("none", "layer", "row", "tensor")
FLASH_ATTN = ("on", "off", "auto")
CACHE_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                    "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
"""Bytes per KV element of llama.cpp's -ctk/-ctv types (ggml block size over 32 elements: q8_0
stores 32 int8 plus an f16 scale in 34 bytes)."""


class ServerConfigError(FlagError):
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
    flash_attn: str = "auto"
    """-fa: on, off or auto."""
    cache_type_k: str = "f16"
    """-ctk: K cache element type."""
    cache_type_v: str = "f16"
    """-ctv: V cache element type."""
    cache_ram_mib: int = 8192
    """--cache-ram: host-memory prompt cache in MiB (-1 no limit, 0 off)."""
    cache_idle_slots: bool = True
    """False with --no-cache-idle-slots: idle slots stay as they are when a task starts."""
    kv_unified: bool | None = None
    """-kvu / -no-kvu: one KV pool shared by the slots; None: only when -np is auto."""
    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = 8080
    """TCP port; 0 picks a free one."""
    api_key: str | None = None
    """--api-key: comma-separated keys; one is required on all but the public routes."""
    api_key_file: str | None = None
    """--api-key-file: more keys, one per line."""
    cors_origins: str | None = None
    """--cors-origins as given; None: * (localhost with built-in tools or MCP servers)."""
    cors_methods: str = http_flags.CORS_METHODS
    """--cors-methods."""
    cors_headers: str = http_flags.CORS_HEADERS
    """--cors-headers."""
    no_cors_credentials: bool = False
    """--no-cors-credentials."""
    no_ui: bool = False
    """--no-ui: GET / answers 404."""
    ui_mcp_proxy: bool = False
    """--ui-mcp-proxy: serve /cors-proxy."""
    slot_save_path: str | None = None
    """--slot-save-path: folder of slot files; None: POST /slots/ID answers 501."""
    tags: str | None = None
    """--tags, comma-separated."""
    chat_template: str | None = None
    """--chat-template (built-in name or Jinja source) or --chat-template-file's text; None: the model's."""
    jinja: bool = True
    """--jinja / --no-jinja."""
    reasoning: str = "auto"
    """-rea/--reasoning: on, off or auto."""
    reasoning_format: str = "auto"
    """--reasoning-format."""
    reasoning_budget: int = -1
    """--reasoning-budget."""
    chat_template_kwargs: tuple[tuple[str, str], ...] = ()
    """--chat-template-kwargs: (name, JSON text) pairs."""
    prefill_assistant: bool = True
    """False with --no-prefill-assistant."""
    verbose: bool = False
    """-v/--verbose: responses carry `__verbose`."""
    gpu: str = "h100"
    """Catalogue GPU the look-alike pretends to run on."""
    catalogue: tuple[str, ...] = ()
    """Extra catalogue YAML files (models, GPUs, links) laid over the built-in one."""
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
    sleep_idle_seconds: int = -1
    """--sleep-idle-seconds: sleep after this long without a task (-1 never; fake_engines/llamacpp/sleep.py)."""
    embedding: bool = False
    """--embedding / --embeddings (or --reranking): serve /embeddings and /v1/embeddings (501 otherwise)."""
    pooling: str = ""
    """--pooling: none, mean, cls, last or rank (--reranking); "" is the model's own."""
    embd_normalize: int = 2
    """--embd-normalize: -1 none, 0 max absolute (int16), 1 taxicab, 2 euclidean, >2 p-norm."""
    spm_infill: bool = False
    """--spm-infill: /infill puts the suffix before the prefix."""
    server_tools: tuple[str, ...] = ()
    """--tools: built-in tools served at /tools ("all" or names); none: /tools answers 403."""
    tools_runtime: str = ""
    """--tools-runtime: where tools run ("" the host; the look-alike refuses any isolate)."""
    mcp_servers_config: str = ""
    """--mcp-servers-config: JSON file of MCP servers whose tools join /tools."""
    mcp_servers_json: str = ""
    """--mcp-servers-json: the same, inline."""

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch"):
            if getattr(self, name) < 1:
                raise ServerConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.embedding and self.n_batch > self.n_ubatch:
            self.n_batch = self.n_ubatch  # llama-server: pooling needs a whole prompt in one ubatch
        if self.n_parallel == 0 or self.n_parallel < -1:
            raise ServerConfigError(f"-np must be >= 1 or -1 (auto), got {self.n_parallel}")
        if self.split_mode not in SPLIT_MODES:
            raise ServerConfigError(f"-sm must be one of {', '.join(SPLIT_MODES)}, got {self.split_mode!r}")
        if not 0.0 <= self.slot_prompt_similarity <= 1.0:
            raise ServerConfigError(f"--slot-prompt-similarity must be in [0, 1], got {self.slot_prompt_similarity}")
        if not 0 <= self.main_gpu < self.num_gpus:
            raise ServerConfigError(f"-mg must be in [0, {self.num_gpus}), got {self.main_gpu}")
        if self.flash_attn not in FLASH_ATTN:
            raise ServerConfigError(f"-fa must be one of {', '.join(FLASH_ATTN)}, got {self.flash_attn!r}")
        for flag, value in (("-ctk", self.cache_type_k), ("-ctv", self.cache_type_v)):
            if value not in CACHE_TYPE_BYTES:
                raise ServerConfigError(f"{flag}: Unsupported cache type: {value} "
                                        f"(allowed: {', '.join(CACHE_TYPE_BYTES)})")
        if self.cache_ram_mib < -1:
            raise ServerConfigError(f"--cache-ram must be >= -1, got {self.cache_ram_mib}")
        if self.time_scale <= 0 or self.load_gbps <= 0:
            raise ServerConfigError("--time-scale and --load-gbps must be > 0")
        if self.startup_s < 0 or not self.mean_output_tokens > 0:
            raise ServerConfigError("--startup-seconds must be >= 0 and --mean-output-tokens > 0")
        if (problem := http_flags.check_http_settings(self.api_key_file, self.slot_save_path)) is not None:
            raise ServerConfigError(problem)

    @property
    def num_gpus(self) -> int:
        """GPUs the server sees: one per -ts entry, else one."""
        return max(len(self.tensor_split), 1)

    @property
    def kv_bytes_per_element(self) -> float:
        """Mean bytes of a K and a V element for -ctk / -ctv."""
        return (CACHE_TYPE_BYTES[self.cache_type_k] + CACHE_TYPE_BYTES[self.cache_type_v]) / 2

    @property
    def model_id(self) -> str:
        """The id /v1/models and responses report: the first of the -a aliases in alphabetical order."""
        return (http_flags.comma_set(self.alias) or [self.model])[0]


def parse_tensor_split(text: str | None) -> list[float]:
    """-ts 3,1 (or 3/1) into proportions."""
    if not text:
        return []
    try:
        return [float(part) for part in re.split(r"[,/]", text) if part]
    except ValueError:
        raise ServerConfigError(f"-ts expects numbers separated by ',' or '/', got {text!r}") from None


def build_parser(parser_class: type[argparse.ArgumentParser] = OneLineParser,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.ArgumentParser:
    """llama-server's flags that shape what clients observe, plus the look-alike's own; `extra`
    adds the flags only the command line has (--print-config)."""
    # allow_abbrev=False: llama.cpp matches whole spellings only, so -ctk is -ctk, never -c tk
    p = parser_class(prog="fake-llama-server", description="Look-alike of llama.cpp's llama-server.",
                     allow_abbrev=False)
    p.add_argument("-m", "--model", default=None, metavar="FNAME",
                   help="a GGUF file, or <catalogue-model or Hugging Face name>-<QUANT>.gguf (need not exist); "
                        "fake-llama-server without it is a router (fake_engines/llamacpp/router_mode.py)")
    p.add_argument("-a", "--alias", default=None, help="model id clients see (default: -m as given)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N", help="KV cells shared by all slots")
    p.add_argument("-np", "--parallel", type=int, default=-1, metavar="N", help="slots; -1: auto (4)")
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=-1, metavar="N",
                   help="layers on GPUs; -1: all")
    p.add_argument("-sm", "--split-mode", default="layer", choices=list(SPLIT_MODES),
                   help="how layers spread over GPUs")
    p.add_argument("-ts", "--tensor-split", default=None, metavar="N0,N1,...", help="share of layers per GPU")
    p.add_argument("-mg", "--main-gpu", type=int, default=0, metavar="INDEX", help="the GPU used with -sm none")
    p.add_argument("-b", "--batch-size", type=int, default=2048, metavar="N", help="logical batch")
    p.add_argument("-ub", "--ubatch-size", type=int, default=512, metavar="N", help="physical batch")
    p.add_argument("--lora", action="append", default=[], metavar="FNAME", help="LoRA adapter at scale 1")
    p.add_argument("--lora-scaled", action="append", nargs=2, default=[], metavar=("FNAME", "SCALE"),
                   help="LoRA adapter with its scale")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up decode at start")
    p.add_argument("--metrics", action="store_true", help="serve /metrics")
    p.add_argument("--no-slots", action="store_true", help="/slots answers 501")
    p.add_argument("--slot-prompt-similarity", "-sps", type=float, default=0.10, metavar="SIMILARITY",
                   help="least common-prefix share to pick a slot by its cache")
    p.add_argument("-fa", "--flash-attn", nargs="?", const="on", default="auto", choices=FLASH_ATTN,
                   help="flash attention: on, off or auto (default auto)")
    p.add_argument("-ctk", "--cache-type-k", default="f16", choices=tuple(CACHE_TYPE_BYTES),
                   help="K cache type; q8_0 halves the KV bytes each step reads")
    p.add_argument("-ctv", "--cache-type-v", default="f16", choices=tuple(CACHE_TYPE_BYTES),
                   help="V cache type; q8_0 halves the KV bytes each step reads")
    p.add_argument("-cram", "--cache-ram", type=int, default=8192, metavar="N",
                   help="host-memory prompt cache, MiB (default 8192, -1 no limit, 0 off)")
    p.add_argument("--no-cache-idle-slots", action="store_true",
                   help="keep idle slots as they are when a task starts (by default each is saved to the "
                        "host cache, and cleared with a unified KV pool)")
    p.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_const", const=True, default=None,
                   help="one KV pool shared by all slots, each slot's context the whole -c "
                        "(default: only when -np is auto)")
    p.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_const", const=False,
                   help="a KV pool per slot")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=port_number, default=8080, help="TCP port; 0 picks a free one")
    p.add_argument("--sleep-idle-seconds", type=int, default=-1, metavar="SECONDS",
                   help="number of seconds of idleness after which the server will sleep (default: -1; -1 = disabled)")
    p.add_argument("--api-key", default=None, help="bearer token required on all but the public routes")
    from fake_engines.driver.faults import add_fault_arguments

    add_fault_arguments(p)
    look = p.add_argument_group("look-alike")
    look.add_argument("--gpu", default="h100", help="catalogue GPU name")
    look.add_argument("--catalogue", action="append", default=[], metavar="FILE", help="extra catalogue YAML")
    look.add_argument("--time-scale", type=float, default=1.0, help="0.01 runs 100x faster than modelled")
    look.add_argument("--seed", type=int, default=0)
    look.add_argument("--load-gbps", type=float, default=5.0, help="weight loading bandwidth, GB/s")
    look.add_argument("--startup-seconds", type=float, default=0.5,
                      help="process start-up before the model loads, modelled seconds")
    look.add_argument("--mean-output-tokens", type=float, default=128.0,
                      help="mean output length before EOS when a request does not ignore it")
    http_flags.add_http_flags(p)
    chat_flags.add_chat_flags(p)
    pooling_flags.add_pooling_flags(p)
    tools_flags.add_tools_flags(p)
    if extra is not None:
        extra(p)
    from fake_engines.factory.upstream import add_upstream_flags
    from fake_engines.llamacpp.upstream_flags import FLAGS

    add_upstream_flags(p, FLAGS, "llama-server flags accepted without effect")
    return p


def config_from_args(args: argparse.Namespace) -> LlamaServerConfig:
    """Flags to a validated LlamaServerConfig."""
    if args.model is None:
        raise ServerConfigError("-m/--model is required")
    loras = [(path, 1.0) for path in args.lora] + [(path, _scale(scale)) for path, scale in args.lora_scaled]
    return LlamaServerConfig(
        model=args.model, alias=args.alias, n_ctx=args.ctx_size, n_parallel=args.parallel,
        n_gpu_layers=args.n_gpu_layers, split_mode=args.split_mode, tensor_split=parse_tensor_split(args.tensor_split),
        main_gpu=args.main_gpu, n_batch=args.batch_size, n_ubatch=args.ubatch_size, loras=loras,
        warmup=not args.no_warmup, metrics=args.metrics, slots=not args.no_slots,
        slot_prompt_similarity=args.slot_prompt_similarity, flash_attn=args.flash_attn,
        cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v, cache_ram_mib=args.cache_ram,
        cache_idle_slots=not args.no_cache_idle_slots, kv_unified=args.kv_unified, host=args.host, port=args.port, api_key=args.api_key,
        gpu=args.gpu, catalogue=tuple(args.catalogue), time_scale=args.time_scale, seed=args.seed,
        load_gbps=args.load_gbps, startup_s=args.startup_seconds, mean_output_tokens=args.mean_output_tokens,
        sleep_idle_seconds=args.sleep_idle_seconds,
        **http_flags.http_settings(args), **chat_flags.chat_settings(args), **pooling_flags.pooling_settings(args),
        **tools_flags.tools_settings(args))


def _scale(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ServerConfigError(f"--lora-scaled expects FNAME SCALE with a number for SCALE, got {text!r}") from None


OPTION_FLAGS: dict[str, str] = {"flash_attn": "-fa", "cache_type_k": "-ctk", "cache_type_v": "-ctv",
                                "cache_ram_mib": "--cache-ram", "n_ctx": "-c", "n_parallel": "-np", "n_gpu_layers": "-ngl", "split_mode": "-sm",
                                "tensor_split": "-ts", "main_gpu": "-mg", "n_batch": "-b", "n_ubatch": "-ub",
                                "alias": "-a", "startup_s": "--startup-seconds"}
"""Config fields whose flag is not `--` plus the field name with dashes (fake_engines.factory.option_flags)."""
