"""Embeddings and reranking as llama-server computes and shapes them (server-context.cpp's
handle_embeddings_impl and post_rerank, server-common.cpp's format_* functions, build 0c1e570), over
made-up but meaningful vectors.

A vector is a function of the prompt's tokens only: each token's hidden state sums hashed character
trigrams of the text around it, plus the whole prompt's trigram bag (every token attends to all, as
in the encoders these routes serve) and a constant direction shared by every input (real embeddings
are anisotropic too). Identical token lists give identical vectors; texts sharing words give vectors
with a high cosine, unrelated texts a low one. A rerank score is a logit of the cosine between the
query's and the document's trigram bags. Everything here is pure; the routes (pooling_routes.py)
queue the prompts on the engine core so slots, timings and metrics account for them.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections import Counter
from dataclasses import dataclass

import numpy as np

from fake_engines.core import decode
from fake_engines.llamacpp.errors import LlamaError
from fake_engines.llamacpp.media import content_text
from fake_engines.llamacpp.prompts import check_vocabulary
from fake_engines.llamacpp.vocab import BOS_ID, has_numbers, token_pieces, tokenize, tokenize_subprompt

SLOTS_PER_TRIGRAM = 8
"""Coordinates each character trigram adds +-1 to (feature hashing)."""
HIDDEN_SCALE = 7.5
"""Typical norm of an unpooled hidden state (pooling none is not normalised)."""
LOCAL_WEIGHT, SHARED_WEIGHT = 0.5, 0.35
"""Weight of a token's own trigrams and of the direction all inputs share, next to the prompt's bag."""


@dataclass(frozen=True)
class EmbeddingRequest:
    """A validated /embeddings or /v1/embeddings body."""

    prompts: list[list[int]]
    """Token ids of each input, special tokens added."""
    oai: bool
    """Answer in OpenAI's shape (a "content" body is answered natively even on /v1/embeddings)."""
    base64: bool
    """encoding_format "base64": little-endian float32 bytes."""
    normalize: int
    """embd_normalize in force."""
    model: object
    """The body's "model", echoed (else the server's model id)."""


@dataclass(frozen=True)
class RerankRequest:
    """A validated /rerank body (Jina's shape, or TEI's when it has "texts")."""

    query: str
    documents: list[str]
    top_n: int
    tei: bool
    """TEI format: a bare list with "score" (and "text" when return_text)."""
    return_text: bool
    model: object


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), "number")


def _type_error(expected: str, value: object) -> LlamaError:
    """nlohmann's type_error on a get<> of the wrong type (a std::exception there: 500)."""
    return LlamaError(500, f"[json.exception.type_error.302] type must be {expected}, but is {_json_type(value)}")


def parse_embedding_request(body: dict, oai: bool, default_normalize: int) -> EmbeddingRequest:
    """The inputs tokenized with special tokens, in llama-server's order of checks."""
    if "input" in body:
        prompt = body["input"]
    elif "content" in body:
        oai, prompt = False, body["content"]  # "content" is not OpenAI's: the native answer
    else:
        raise LlamaError(400, "\"input\" or \"content\" must be provided")
    use_base64 = _encoding_format(body)
    if isinstance(prompt, list) and not has_numbers(prompt):
        prompts = [_entry_tokens(p) for p in prompt]
    else:
        prompts = [_entry_tokens(prompt)]
    if not prompts:
        raise LlamaError(400, "\"input\" must not be empty")
    if any(not ids for ids in prompts):  # for models that add no BOS
        raise LlamaError(400, "Input content cannot be empty")
    normalize = default_normalize
    if "embd_normalize" in body:
        value = body["embd_normalize"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error("number", value)
        normalize = int(value)
    return EmbeddingRequest(prompts, oai, use_base64, normalize, body.get("model"))


def _encoding_format(body: dict) -> bool:
    if "encoding_format" not in body:
        return False
    fmt = body["encoding_format"]
    if not isinstance(fmt, str):
        raise _type_error("string", fmt)
    if fmt not in ("float", "base64"):
        raise LlamaError(400, "The format to return the embeddings in. Can be either float or base64")
    return fmt == "base64"


def _entry_tokens(entry: object) -> list[int]:
    """One input: what tokenize_input_subprompt takes, or {"content": [parts]} (OpenAI content)."""
    if isinstance(entry, dict) and "content" in entry:
        if not isinstance(entry["content"], list):
            raise LlamaError(400, "\"content\" must be an array")
        return tokenize(content_text(entry["content"]), add_special=True)
    return tokenize_subprompt(entry, add_special=True)


def check_task_tokens(ids: list[int], n_ubatch: int, slot_n_ctx: int) -> None:
    """What a slot refuses when it takes an embedding or rerank task: ids outside the vocabulary,
    and a prompt that does not fit one physical batch (pooling needs all tokens in one ubatch) or
    the slot's context."""
    check_vocabulary(ids)
    if len(ids) > n_ubatch:
        raise LlamaError(500, f"input ({len(ids)} tokens) is too large to process. increase the physical batch "
                              f"size (current batch size: {n_ubatch})")
    if len(ids) > slot_n_ctx:
        raise LlamaError(400, f"input ({len(ids)} tokens) is larger than the max context size ({slot_n_ctx} tokens). "
                              "skipping", "exceed_context_size_error", n_prompt_tokens=len(ids), n_ctx=slot_n_ctx)


@functools.lru_cache(maxsize=65536)
def _trigram_slots(gram: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Where a trigram adds and with which sign: a hash of the trigram, the same in every process."""
    seed = int.from_bytes(hashlib.blake2b(gram.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    return rng.integers(0, dim, SLOTS_PER_TRIGRAM), rng.choice((-1.0, 1.0), SLOTS_PER_TRIGRAM)


@functools.lru_cache(maxsize=16)
def _shared_direction(dim: int) -> np.ndarray:
    v = np.random.default_rng(dim).standard_normal(dim)
    return v / np.linalg.norm(v)


def _local_features(ids: list[int], dim: int) -> np.ndarray:
    """One row per token: the hashed trigrams of the lower-cased text that start in the token."""
    pieces = token_pieces(ids)
    text = " " + "".join(pieces).lower() + " "
    owner = np.repeat(np.arange(len(ids)), [len(p) for p in pieces])
    rows = np.zeros((len(ids), dim))
    for start in range(len(text) - 2):
        index, sign = _trigram_slots(text[start:start + 3], dim)
        token = owner[min(max(start - 1, 0), len(owner) - 1)] if len(owner) else 0
        np.add.at(rows[token], index, sign)
    return rows


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)


def hidden_states(ids: list[int], dim: int) -> np.ndarray:
    """The last layer's output for each token (n_tokens x dim), a function of `ids` alone."""
    local = _local_features(ids, dim)
    bag = _unit(local.sum(axis=0))
    return HIDDEN_SCALE * (bag + LOCAL_WEIGHT * _unit(local) + SHARED_WEIGHT * _shared_direction(dim))


def normalize(vec: np.ndarray, mode: int) -> np.ndarray:
    """common_embd_normalize: -1 none, 0 max absolute scaled to int16, 2 euclidean, other p-norms."""
    if mode == -1:
        total = 1.0
    elif mode == 0:
        total = float(np.max(np.abs(vec))) / 32760.0
    elif mode == 2:
        total = float(np.sqrt(np.sum(vec * vec)))
    else:
        total = float(np.sum(np.abs(vec) ** mode) ** (1.0 / mode))
    return vec * (1.0 / total if total > 0 else 0.0)


def embed(ids: list[int], dim: int, pooling: str, mode: int) -> list[list[float]]:
    """What a slot returns for one prompt: every token's state (pooling none, not normalised), else
    the pooled vector, normalised by `mode`."""
    states = hidden_states(ids, dim)
    if pooling == "none":
        return states.astype(np.float32).tolist()
    pooled = {"mean": states.mean(axis=0), "last": states[-1]}.get(pooling, states[0])  # cls, rank: the first
    return [normalize(pooled, mode).astype(np.float32).tolist()]


def oai_body(req: EmbeddingRequest, model_id: str, vectors: list[list[list[float]]],
             n_tokens: list[int]) -> dict:
    """format_embeddings_response_oaicompat: one data item per input, usage of all prompt tokens."""
    data = []
    for i, vec in enumerate(vectors):
        if req.base64:
            raw = base64.b64encode(np.asarray(vec[0], dtype="<f4").tobytes()).decode("ascii")
            data.append({"embedding": raw, "index": i, "object": "embedding", "encoding_format": "base64"})
        else:
            data.append({"embedding": vec[0], "index": i, "object": "embedding"})
    total = sum(n_tokens)
    return {"model": req.model if isinstance(req.model, str) else model_id, "object": "list",
            "usage": {"prompt_tokens": total, "total_tokens": total}, "data": data}


def native_body(vectors: list[list[list[float]]]) -> list[dict]:
    """/embeddings' answer: per input its index and a list of vectors (one per token with pooling none)."""
    return [{"index": i, "embedding": vec} for i, vec in enumerate(vectors)]


def parse_rerank_request(body: dict) -> RerankRequest:
    """post_rerank's checks: a string query, a non-empty list of string documents (or TEI's texts)."""
    if "query" not in body:
        raise LlamaError(400, "\"query\" must be provided")
    if not isinstance(body["query"], str):
        raise LlamaError(400, "\"query\" must be a string")
    documents = _string_list(body.get("documents"), _string_list(body.get("texts"), []))
    if not documents:
        raise LlamaError(400, "\"documents\" must be a non-empty string array")
    top_n = body.get("top_n")
    top_n = int(top_n) if isinstance(top_n, int | float) else len(documents)  # json_value: wrong type -> default
    tei = "texts" in body
    return RerankRequest(body["query"], documents, top_n, tei, tei and body.get("return_text") is True,
                         body.get("model"))


def _string_list(value: object, default: list[str]) -> list[str]:
    """json_value(body, key, std::vector<std::string>()): the default for null or another type."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return default


def rerank_tokens(query: str, document: str) -> tuple[list[int], list[int]]:
    """format_prompt_rerank without a rerank template: the task's prompt is BOS and the query's ids,
    then the document's (this vocabulary adds no EOS or SEP); returned as the two parts."""
    return tokenize(query, add_special=True), tokenize(document, add_special=False)


def _text(ids: list[int]) -> str:
    return decode(ids[1:] if ids[:1] == [BOS_ID] else ids)


def _trigrams(text: str) -> Counter[str]:
    padded = " " + text.lower() + " "
    return Counter(padded[i:i + 3] for i in range(len(padded) - 2))


def rerank_score(query: list[int], document: list[int]) -> float:
    """The classifier's logit for token ids of a query and a document: how much of the query's
    trigrams the document holds (a long document is not penalised for its other words), a little of
    their cosine to order documents that hold all of it."""
    q, d = _trigrams(_text(query)), _trigrams(_text(document))
    covered = sum(min(n, d[g]) for g, n in q.items()) / max(sum(q.values()), 1)
    dot = sum(n * d[g] for g, n in q.items())
    cosine = dot / max(np.sqrt(sum(n * n for n in q.values()) * sum(n * n for n in d.values())), 1.0)
    return float(np.float32(10.0 * covered + 2.0 * cosine - 6.0))


def rerank_body(req: RerankRequest, model_id: str, scores: list[float], n_tokens: list[int]) -> dict | list:
    """format_response_rerank: results by descending score, cut to top_n (a negative top_n fails
    as std::vector::resize does); TEI gets the bare list."""
    label = "score" if req.tei else "relevance_score"
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: equal scores keep document order
    results = [{"index": i, label: scores[i], **({"text": req.documents[i]} if req.return_text else {})}
               for i in order]
    if req.top_n < 0:
        raise LlamaError(500, "vector::_M_default_append")
    results = results[:req.top_n]
    if req.tei:
        return results
    total = sum(n_tokens)
    return {"model": req.model if isinstance(req.model, str) else model_id, "object": "list",
            "usage": {"prompt_tokens": total, "total_tokens": total}, "results": results}
