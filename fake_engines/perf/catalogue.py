"""GPU, link and model catalogue: the hardware and model figures every perf calculation starts from.

The entries live in ``catalogue.yaml`` beside this module; users add or override entries by name
with extra YAML files of the same layout (``--catalogue FILE``).
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from os import PathLike
from typing import Any

import yaml


class CatalogueError(ValueError):
    """An unknown name or a malformed catalogue entry."""


def _positive(spec: Any, *names: str) -> None:
    for name in names:
        if not getattr(spec, name) > 0:
            raise CatalogueError(f"{type(spec).__name__} {spec.name!r}: {name} must be positive, "
                                 f"got {getattr(spec, name)!r}")


def _not_negative(spec: Any, *names: str) -> None:
    for name in names:
        if getattr(spec, name) < 0:
            raise CatalogueError(f"{type(spec).__name__} {spec.name!r}: {name} must not be negative, "
                                 f"got {getattr(spec, name)!r}")


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator (or the host CPU, for llama.cpp layers left off the GPU)."""

    name: str
    """Short name used by flags (h100, h200, ...)."""
    memory_gb: float
    """Device memory, decimal GB (1e9 bytes)."""
    bandwidth_tbs: float
    """Memory bandwidth, TB/s (1e12 bytes per second)."""
    bf16_tflops: float
    """Dense BF16 tensor throughput, TFLOP/s (no sparsity)."""
    nvlink_gbps: float = 0.0
    """NVLink bandwidth per direction, GB/s; 0 when the device has none."""
    source: str = ""
    """Where the figures come from."""

    def __post_init__(self) -> None:
        _positive(self, "memory_gb", "bandwidth_tbs", "bf16_tflops")
        _not_negative(self, "nvlink_gbps")

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_tbs * 1e12

    @property
    def flops_s(self) -> float:
        return self.bf16_tflops * 1e12


@dataclass(frozen=True)
class LinkSpec:
    """An interconnect between the GPUs of one engine."""

    name: str
    """Short name used by flags (nvlink, pcie4, ...)."""
    gbps_per_direction: float
    """Bandwidth per direction, GB/s (1e9 bytes per second)."""
    latency_us: float
    """Fixed start-up delay of one ring step, microseconds."""
    source: str = ""
    """Where the figures come from."""

    def __post_init__(self) -> None:
        _positive(self, "gbps_per_direction")
        _not_negative(self, "latency_us")

    @property
    def bytes_s(self) -> float:
        return self.gbps_per_direction * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a transformer, as its config.json states it."""

    name: str
    """Catalogue name (llama-3.1-8b, ...) or "custom" for an explicit shape."""
    params: float
    """All parameters, including every expert."""
    active_params: float
    """Parameters used per token (equal to params for dense models)."""
    layers: int
    """Transformer layers (num_hidden_layers)."""
    hidden: int = 0
    """Hidden size (width of the residual stream)."""
    heads: int = 0
    """Attention query heads."""
    kv_heads: int = 0
    """Key/value heads (grouped-query attention)."""
    head_dim: int = 128
    """Width of one attention head."""
    intermediate: int = 0
    """MLP intermediate size (per expert for MoE models)."""
    vocab: int = 0
    """Vocabulary size."""
    experts: int = 0
    """Routed experts per MoE layer; 0 for dense models."""
    top_k: int = 0
    """Experts each token is routed to."""
    kv_latent_dim: int = 0
    """Cached width per token per layer for multi-head latent attention; 0 = ordinary K and V heads."""
    tied_embeddings: bool = False
    """The LM head reuses the embedding table (then the table is read every step)."""
    max_position_embeddings: int = 0
    """Context length the model was trained for (config.json `max_position_embeddings`): vLLM's
    default --max-model-len and llama.cpp's n_ctx_train; 0 when unknown (an explicit shape)."""
    pooling: str = ""
    """How an embedding or reranking model pools its tokens (the GGUF's pooling_type, llama-server's
    default --pooling): cls, mean, last or rank; empty for a generative model (llama.cpp's none)."""
    fim: bool = False
    """The vocabulary has fill-in-the-middle tokens (prefix, suffix, middle): llama-server serves /infill."""
    aliases: tuple[str, ...] = ()
    """Other names of the same shape (Hugging Face ids or their last part, any case), for names the
    rule in `model_name_candidates` does not reach (meta-llama/Llama-3.3-70B-Instruct)."""
    source: str = ""
    """Where the shape comes from."""

    def __post_init__(self) -> None:
        _positive(self, "params", "active_params", "layers")
        _not_negative(self, "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "experts",
                      "top_k", "kv_latent_dim", "max_position_embeddings")
        if self.active_params > self.params:
            raise CatalogueError(f"model {self.name!r}: active_params exceeds params")
        if self.top_k > self.experts:
            raise CatalogueError(f"model {self.name!r}: top_k ({self.top_k}) exceeds experts ({self.experts})")

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def kv_bytes_per_token(self, dtype_bytes: float = 2) -> float:
        """KV-cache bytes one token occupies over all layers (K and V, or the MLA latent)."""
        if self.kv_latent_dim:
            return self.layers * self.kv_latent_dim * dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def weight_bytes(self, bits: float = 16) -> float:
        """Bytes of all weights at ``bits`` per weight."""
        return self.params * bits / 8

    @property
    def embedding_params(self) -> float:
        """Parameters of the input embedding table that a step only looks rows up in."""
        return 0.0 if self.tied_embeddings else float(self.vocab * self.hidden)

    @property
    def expert_params(self) -> float:
        """Parameters of all routed experts (three hidden x intermediate matrices each, SwiGLU)."""
        return float(self.layers * self.experts * 3 * self.hidden * self.intermediate)


@dataclass(frozen=True)
class Catalogue:
    """Named GPUs, links and models."""

    gpus: Mapping[str, GpuSpec] = field(default_factory=dict)
    """GPU short name -> spec."""
    links: Mapping[str, LinkSpec] = field(default_factory=dict)
    """Link short name -> spec."""
    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    """Model name -> shape."""

    def gpu(self, name: str) -> GpuSpec:
        return _lookup(self.gpus, name, "GPU")

    def link(self, name: str) -> LinkSpec:
        return _lookup(self.links, name, "link")

    def model(self, name: str) -> ModelSpec:
        """The entry `name` names: a catalogue name, an alias, or a Hugging Face id or GGUF stem
        reduced by `model_name_candidates` to one of those; CatalogueError says how to add one."""
        # an alias counts by its last part too, so the rule's reductions reach it
        aliases = {key: spec for spec in self.models.values() for alias in spec.aliases
                   for key in (alias.lower(), alias.lower().rsplit("/", 1)[-1])}
        for candidate in model_name_candidates(name):
            spec = self.models.get(candidate) or aliases.get(candidate)
            if spec is not None:
                return spec
        raise CatalogueError(
            f"unknown model {name!r}; valid names: {', '.join(sorted(self.models))} (and Hugging Face ids of "
            "them: instruct, chat and quantised variants resolve to the base entry); add one with --catalogue FILE "
            "(a `models:` entry with its config.json shape, `aliases: [org/name]` for the ids that name it)")


VARIANT_WORDS = frozenset({
    "instruct", "chat", "it", "hf", "base", "awq", "gptq", "int4", "int8", "fp8", "fp16", "bf16", "dynamic",
    "gguf", "bnb", "4bit", "8bit", "nf4", "w4a16", "w8a8", "w8a16", "w4a8", "exl2", "mlx", "quantized", "marlin"})
"""Dash-separated words a Hugging Face repo adds to a base model's name for a tuned or quantised
variant of the same shape (Llama-3.1-8B-Instruct, Qwen2.5-32B-Instruct-AWQ, ...-GPTQ-Int4)."""
_VERSION_WORD = re.compile(r"^(v\d+(\.\d+)*|\d{4})$")
"""Release tags after the size (Mistral-7B-Instruct-v0.3, Qwen3-30B-A3B-Instruct-2507)."""


def model_name_candidates(name: str) -> list[str]:
    """The names a model name may be listed under, most specific first (the catalogue's rule):
    the name as given, its last path part (org/ or a directory dropped), then that part with
    trailing variant words (VARIANT_WORDS) and release tags (v0.3, 2507) dropped one at a
    time, each also without a leading `meta-` (Meta-Llama-3.1-8B-Instruct); all lower case.
    A word that is neither stops the dropping, so a different size is never reached."""
    lowered = name.strip().lower()
    last = lowered.rstrip("/").rsplit("/", 1)[-1]
    candidates = [lowered, last]
    words = last.split("-")
    while len(words) > 1 and (words[-1] in VARIANT_WORDS or _VERSION_WORD.match(words[-1])):
        words.pop()
        candidates.append("-".join(words))
    candidates += [c.removeprefix("meta-") for c in candidates if c.startswith("meta-")]
    return list(dict.fromkeys(candidates))


def _lookup(table: Mapping[str, Any], name: str, kind: str) -> Any:
    try:
        return table[name.lower()]
    except KeyError:
        raise CatalogueError(f"unknown {kind} {name!r}; valid names: {', '.join(sorted(table))}") from None


def _value(key: str, value: Any) -> Any:
    # YAML 1.1 reads 8.03e9 (no sign in the exponent) as a string
    if key == "name":
        return str(value).lower()
    if key == "aliases":
        return tuple(str(v).lower() for v in value) if isinstance(value, list) else (str(value).lower(),)
    if key not in ("source", "pooling") and isinstance(value, str):
        return float(value)
    return value


_SECTIONS = {"gpus": GpuSpec, "links": LinkSpec, "models": ModelSpec}


def _entry(cls: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict) or "name" not in raw:
        raise CatalogueError(f"{where}: every entry needs a 'name'")
    known = {f.name for f in fields(cls)}
    unknown = set(raw) - known
    if unknown:
        raise CatalogueError(f"{where}: entry {raw['name']!r} has unknown fields {sorted(unknown)}")
    try:
        return cls(**{k: _value(k, v) for k, v in raw.items()})
    except (TypeError, ValueError) as exc:
        raise CatalogueError(f"{where}: entry {raw['name']!r}: {exc}") from None


def parse_catalogue(doc: Mapping[str, Any], where: str, base: Catalogue | None = None) -> Catalogue:
    """Merge one parsed YAML document onto ``base``; entries with an existing name replace it."""
    tables = {s: dict(getattr(base, s)) if base else {} for s in _SECTIONS}
    if not isinstance(doc or {}, Mapping):
        raise CatalogueError(f"{where}: must be a mapping of sections ({', '.join(_SECTIONS)})")
    for section, raw_entries in (doc or {}).items():
        if section not in _SECTIONS:
            raise CatalogueError(f"{where}: unknown section {section!r}; valid: {', '.join(_SECTIONS)}")
        if not isinstance(raw_entries or [], list):
            raise CatalogueError(f"{where}: section {section!r} must be a list of entries")
        for raw in raw_entries or []:
            spec = _entry(_SECTIONS[section], raw, f"{where} [{section}]")
            tables[section][spec.name] = spec
    return Catalogue(**tables)


def load_catalogue(extra: Sequence[str | PathLike[str]] = ()) -> Catalogue:
    """The built-in catalogue, then each user file in order, later names overriding earlier ones."""
    text = importlib.resources.files(__package__).joinpath("catalogue.yaml").read_text(encoding="utf-8")
    cat = parse_catalogue(yaml.safe_load(text), "catalogue.yaml")
    for path in extra:
        cat = parse_catalogue(_read_yaml(path), str(path), cat)
    return cat


def _read_yaml(path: str | PathLike[str]) -> Any:
    """A user catalogue file; unreadable or not YAML is a CatalogueError saying where (file:line:col)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except UnicodeDecodeError:
        raise CatalogueError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise CatalogueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise CatalogueError(f"{where}: invalid YAML: {', '.join(p for p in (exc.context, exc.problem) if p)}") from None
    except yaml.YAMLError as exc:
        raise CatalogueError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None


def model_from_shape(params: float, layers: int, kv_heads: int, head_dim: int = 128,
                     active_params: float | None = None, name: str = "custom", **shape: int) -> ModelSpec:
    """A ModelSpec from explicit shape flags (--params --layers --kv-heads --head-dim ...)."""
    for label, value in (("params", params), ("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if value is None or value <= 0:
            raise CatalogueError(f"explicit model shape: {label} must be positive, got {value}")
    sizes: dict[str, Any] = {k: int(v) for k, v in shape.items() if v is not None}
    return ModelSpec(name=name, params=float(params),
                     active_params=float(active_params if active_params else params),
                     layers=int(layers), kv_heads=int(kv_heads), head_dim=int(head_dim),
                     source="explicit shape", **sizes)
