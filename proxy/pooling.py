"""Embeddings and rerank requests: which backends serve each route, how they are routed, and the
routing view of their bodies.

These requests compute a prompt and decode nothing, and their inputs share no prefix an engine
could reuse (llama-server runs them without its prompt cache), so prefix affinity buys nothing:
they go to the backend with the least work the proxy has in flight there (prompt plus reserved
output tokens), whatever policy routes generation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from policies.routing.base import RequestInfo
from proxy.errors import ProxyError

POOLING_POLICY = "least-load:signal=in_flight_tokens"
"""The routing policy of every pooling route (proxy/app.py builds its dispatcher with it)."""

ROUTE_FLAVORS: dict[str, frozenset[str] | None] = {
    "/v1/embeddings": None,
    "/embeddings": frozenset({"llamacpp"}),
    "/v1/rerank": frozenset({"llamacpp", "vllm"}),
    "/rerank": frozenset({"llamacpp", "vllm"}),
}
"""Each forwarded pooling path and the backend flavors that serve it (None: every flavor). OpenAI's
/v1/embeddings is everyone's; /embeddings is llama-server's native route; rerank is llama-server's
and vLLM's (Jina's and Cohere's shape), not OpenAI's."""

_INPUT_KEYS = {"/v1/embeddings": ("input",), "/embeddings": ("input", "content")}


def parse_pooling_request(body: dict, path: str, headers: Mapping[str, str], chars_per_token: float) -> RequestInfo:
    """Check what routing reads (model, the inputs' presence) and estimate the prompt tokens the
    backend will compute; the engine checks the rest of the body."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ProxyError(400, "'model' must be a string.", param="model")
    if path in _INPUT_KEYS:
        keys = _INPUT_KEYS[path]
        if not any(k in body for k in keys):
            raise ProxyError(400, f"'{keys[0]}' is required.", param=keys[0])
        tokens = _estimate(next(body[k] for k in keys if k in body), chars_per_token)
    else:
        tokens = _rerank_tokens(body, chars_per_token)
    return RequestInfo(model=model, prompt_tokens=tokens, max_tokens=0, headers=headers,
                       request_id=headers.get("x-request-id"))


def _rerank_tokens(body: dict, chars_per_token: float) -> int:
    query = body.get("query")
    if not isinstance(query, str):
        raise ProxyError(400, "'query' must be a string.", param="query")
    documents = body.get("documents", body.get("texts"))
    if not isinstance(documents, list) or not documents:
        raise ProxyError(400, "'documents' must be a non-empty array.", param="documents")
    # every document is scored with the query in front of it
    return sum(_estimate(query, chars_per_token) + _estimate(d, chars_per_token) for d in documents)


def _estimate(value: object, chars_per_token: float) -> int:
    """Tokens of an input: characters over chars_per_token for text, one per token id, summed over
    lists and over the values of objects (content parts, {"text": ...} documents)."""
    if isinstance(value, str):
        return math.ceil(len(value) / chars_per_token)
    if isinstance(value, int) and not isinstance(value, bool):
        return 1
    if isinstance(value, list):
        return sum(_estimate(v, chars_per_token) for v in value)
    if isinstance(value, dict):
        return sum(_estimate(v, chars_per_token) for v in value.values())
    return 0
