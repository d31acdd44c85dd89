"""What `-m MODEL.gguf` names: a real GGUF file (metadata read with `gguf`) or a catalogue model
plus quantisation spelled as a file name (llama-3.1-8b-Q4_K_M.gguf) that need not exist."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fake_engines.driver.chat import CHATML_TEMPLATE
from fake_engines.factory.catalogue import catalogue_of
from fake_engines.perf.catalogue import CatalogueError, ModelSpec, model_from_shape
from flotilla.errors import FlagError

QUANT_BITS = {"F32": 32.0, "F16": 16.0, "BF16": 16.0, "Q8_0": 8.5, "Q6_K": 6.56, "Q5_K_M": 5.69,
              "Q5_K_S": 5.54, "Q5_0": 5.5, "Q4_K_M": 4.85, "Q4_K_S": 4.58, "Q4_0": 4.5, "Q3_K_M": 3.91,
              "Q3_K_S": 3.5, "Q2_K": 2.63, "IQ4_XS": 4.25}
"""Bits per weight of llama.cpp's common file types (llama-quantize's table, K-quant mixes averaged)."""

FTYPE_NAMES = {0: "all F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 7: "MOSTLY_Q8_0", 10: "MOSTLY_Q2_K",
               12: "MOSTLY_Q3_K_M", 14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S",
               17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K", 32: "MOSTLY_BF16"}
"""general.file_type values as llama.cpp names them in /v1/models meta.ftype."""

_NAME = re.compile(r"^(?P<model>.+?)[-.](?P<quant>[A-Za-z0-9_]+)\.gguf$", re.IGNORECASE)


class ModelFileError(FlagError):
    """-m names neither a readable GGUF nor a catalogue model with a known quantisation."""


@dataclass(frozen=True)
class GgufModel:
    """The served model as llama-server knows it after loading."""

    path: str
    """-m as given (llama-server's model id when no --alias)."""
    spec: ModelSpec
    """Shape for the perf model."""
    bits_per_weight: float
    """Average bits per weight of the file type."""
    n_ctx_train: int
    """Trained context length."""
    ftype: str
    """File type name (all F32, MOSTLY_Q4_K_M, ...)."""
    size_bytes: int
    """Bytes of weights."""
    vocab_size: int
    """Vocabulary entries."""
    chat_template: str | None = None
    """tokenizer.chat_template; a catalogue model carries the ChatML template of the captured engine's model."""
    chat_template_tool_use: str | None = None
    """tokenizer.chat_template.tool_use: the variant llama-server renders requests with tools with."""


def load_model(path: str, catalogue: tuple[str, ...] = ()) -> GgufModel:
    """Read a real GGUF, else parse the file name against the catalogue (with `catalogue` files)."""
    if Path(path).is_file():
        return _from_gguf(path)
    return _from_name(path, catalogue)


def _from_name(path: str, catalogue: tuple[str, ...] = ()) -> GgufModel:
    match = _NAME.match(Path(path).name)
    quant = match.group("quant").upper() if match else ""
    if not match or quant not in QUANT_BITS:
        raise ModelFileError(f"failed to load model '{path}': not a GGUF file, and not <catalogue-model>-"
                             f"<{'|'.join(QUANT_BITS)}>.gguf")
    try:
        spec = catalogue_of(catalogue).model(match.group("model").lower())
    except (CatalogueError, KeyError) as exc:
        raise ModelFileError(f"failed to load model '{path}': {exc}") from None
    bits = QUANT_BITS[quant]
    ftype = "all F32" if quant == "F32" else f"MOSTLY_{quant}"
    return GgufModel(path=path, spec=spec, bits_per_weight=bits, n_ctx_train=spec.max_position_embeddings or 131072,
                     ftype=ftype,
                     size_bytes=int(spec.params * bits / 8), vocab_size=spec.vocab, chat_template=CHATML_TEMPLATE)


def _field(reader, key: str, default=None):
    field = reader.get_field(key)
    if field is None:
        return default
    value = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode()
    return value.tolist()[0]


def _from_gguf(path: str) -> GgufModel:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as exc:  # gguf raises plain ValueError/struct errors for any malformed file
        raise ModelFileError(f"failed to load model '{path}': {exc}") from None
    arch = _field(reader, "general.architecture", "llama")
    layers = int(_field(reader, f"{arch}.block_count", 1))
    heads = int(_field(reader, f"{arch}.attention.head_count", 1))
    hidden = int(_field(reader, f"{arch}.embedding_length", 1))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    params = sum(int(t.n_elements) for t in reader.tensors)
    size = sum(int(t.n_bytes) for t in reader.tensors)
    tokens = reader.get_field("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else 0
    spec = model_from_shape(params=params, layers=layers, kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv",
                                                                              heads)),
                            head_dim=head_dim, name=Path(path).stem, hidden=hidden, heads=heads, vocab=vocab)
    ftype = int(_field(reader, "general.file_type", 0))
    return GgufModel(path=path, spec=spec, bits_per_weight=size * 8 / max(params, 1),
                     n_ctx_train=int(_field(reader, f"{arch}.context_length", 2048)),
                     ftype=FTYPE_NAMES.get(ftype, f"MOSTLY_TYPE_{ftype}"), size_bytes=size, vocab_size=vocab,
                     chat_template=_field(reader, "tokenizer.chat_template"),
                     chat_template_tool_use=_field(reader, "tokenizer.chat_template.tool_use"))
