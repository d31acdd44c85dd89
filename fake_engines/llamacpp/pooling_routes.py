"""The pooling routes of the fake llama-server: /embedding(s), /v1/embeddings, /rerank (and its
other paths). Each parses the body (embeddings.py), runs every prompt on the engine core as a
prompt-only task (slots, timings and metrics see its prompt tokens, nothing decoded), and formats
what embeddings.py computes from the tokens."""

from __future__ import annotations

import asyncio

from aiohttp import web

from fake_engines.core import EngineRequest, RequestRejected
from fake_engines.driver.serving import json_body
from fake_engines.llamacpp import embeddings as emb
from fake_engines.llamacpp.app import SERVER_KEY, LlamaServer
from fake_engines.llamacpp.errors import LlamaError, parse_json

EMBEDDING_PATHS = ("/embedding", "/embeddings")
"""llama-server's native embedding routes (/embedding is the legacy spelling)."""
OAI_EMBEDDING_PATHS = ("/v1/embeddings",)
RERANK_PATHS = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")


def pooling_of(server: LlamaServer) -> str:
    """--pooling, else the model's own (a generative model's is none)."""
    return server.config.pooling or server.model.spec.pooling or "none"


async def run_prompts(server: LlamaServer, prompts: list[list[int]]) -> None:
    """Queue each prompt as a prompt-only task and wait until the slots have computed them all; the
    tasks are dropped if the client goes away."""
    for ids in prompts:
        emb.check_task_tokens(ids, server.config.n_ubatch, server.slot_n_ctx)
    handles = []
    try:
        for ids in prompts:
            request = EngineRequest(request_id=server.request_id(), prompt_token_ids=ids, max_tokens=0, output_len=0)
            handles.append(server.driver.submit(request))
        for handle in handles:
            async for _ in handle.outputs():
                pass
    except RequestRejected as exc:
        raise LlamaError(400, exc.message, "exceed_context_size_error", n_prompt_tokens=exc.n_prompt_tokens,
                         n_ctx=exc.n_ctx) from None
    finally:
        for handle in handles:
            server.driver.abort(handle.request.request_id)  # a no-op for the finished ones


async def _embeddings(request: web.Request, oai: bool) -> web.Response:
    server = request.app[SERVER_KEY]
    if not server.config.embedding:
        raise LlamaError(501, "This server does not support embeddings. Start it with `--embeddings`")
    pooling = pooling_of(server)
    if oai and pooling == "none":
        raise LlamaError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    req = emb.parse_embedding_request(parse_json(await request.read()), oai, server.config.embd_normalize)
    await run_prompts(server, req.prompts)
    dim = server.model.spec.hidden
    vectors = await asyncio.to_thread(lambda: [emb.embed(ids, dim, pooling, req.normalize) for ids in req.prompts])
    if req.oai:
        return json_body(emb.oai_body(req, server.config.model_id, vectors, [len(p) for p in req.prompts]))
    return json_body(emb.native_body(vectors))


async def embeddings(request: web.Request) -> web.Response:
    """POST /embeddings: per input its vectors (every token's with --pooling none)."""
    return await _embeddings(request, oai=False)


async def embeddings_oai(request: web.Request) -> web.Response:
    """POST /v1/embeddings: OpenAI's list of embeddings with usage."""
    return await _embeddings(request, oai=True)


async def rerank(request: web.Request) -> web.Response:
    """POST /rerank: a relevance score per document, best first (Jina's shape, TEI's with "texts")."""
    server = request.app[SERVER_KEY]
    if not server.config.embedding or server.config.pooling != "rank":
        raise LlamaError(501, "This server does not support reranking. Start it with `--reranking`")
    req = emb.parse_rerank_request(parse_json(await request.read()))
    pairs = [emb.rerank_tokens(req.query, doc) for doc in req.documents]
    prompts = [query + doc for query, doc in pairs]
    await run_prompts(server, prompts)
    scores = [emb.rerank_score(query, doc) for query, doc in pairs]
    return json_body(emb.rerank_body(req, server.config.model_id, scores, [len(p) for p in prompts]))


def add_pooling_routes(app: web.Application) -> None:
    """Register the routes (each answers 501 unless its flag or the model allows it, as llama-server's do)."""
    for path in EMBEDDING_PATHS:
        app.router.add_post(path, embeddings)
    for path in OAI_EMBEDDING_PATHS:
        app.router.add_post(path, embeddings_oai)
    for path in RERANK_PATHS:
        app.router.add_post(path, rerank)
    from fake_engines.llamacpp.infill import infill

    app.router.add_post("/infill", infill)
