"""Embeddings and rerank through the proxy, over real sockets, in front of look-alike llama-servers
(and a look-alike vLLM for the routes it does not serve): the answers are the engine's, the routing
is load-aware and goes only to flavors that serve the route, bad input gets the proxy's 4xx."""

from __future__ import annotations

from dataclasses import replace

import aiohttp
import openai
import pytest

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from fake_engines.vllm.config import VllmServeConfig
from fake_engines.vllm.server import start_vllm
from policies.routing.base import RequestInfo
from proxy.config import BackendSpec
from proxy.errors import ProxyError
from proxy.pooling import parse_pooling_request
from tests.proxy.conftest import ProxyFactory

EMBEDDER = "bge-small-en-v1.5-F16.gguf"
RERANKER = "jina-reranker-v1-tiny-en-F16.gguf"


@pytest.fixture
async def llamas():
    """Starts look-alike llama-servers in this loop, ready at once; closes them after the test."""
    started = []

    async def start(model: str = EMBEDDER, **flags: object):
        config = LlamaServerConfig(model=model, port=0, time_scale=0.01, n_parallel=2, n_ctx=1024, **flags)
        running = await start_llama(config, cold_start=False)
        started.append(running)
        return BackendSpec(f"http://127.0.0.1:{running.port}", "llamacpp")

    yield start
    for running in started:
        await running.close()


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, str, object]:
    async with session.post(url, json=body) as r:
        return r.status, r.headers.get("x-flotilla-backend", ""), await r.json()


async def test_embeddings_pass_through_as_the_engine_answers_and_go_to_the_least_loaded_backend(
        llamas, proxy_for: ProxyFactory) -> None:
    fleet = [await llamas(embedding=True), await llamas(embedding=True)]
    p = await proxy_for(fleet)
    text = "I believe the meaning of life is"
    async with aiohttp.ClientSession() as s:
        status, first, direct = await _post(s, fleet[0].url + "/v1/embeddings", {"input": text})
        assert status == 200
        # the proxy holds work in flight on the first backend: the embedding goes to the other
        p.proxy.pool.reserve(p.proxy.pool.backends[0], 10_000)
        status, backend, proxied = await _post(s, p.url + "/v1/embeddings", {"input": text})
        assert (status, backend) == (200, fleet[1].url)
        assert proxied["data"][0]["embedding"] == direct["data"][0]["embedding"]  # the same model: the same vector
        assert len(proxied["data"][0]["embedding"]) == 384 and proxied["usage"]["prompt_tokens"] > 0
        status, _, native = await _post(s, p.url + "/embeddings", {"content": text})
        assert status == 200 and isinstance(native, list) and native[0]["index"] == 0
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="x")
    listed = await client.embeddings.create(model=EMBEDDER, input=[text, "an unrelated sentence about ducks"])
    await client.close()
    assert [d.index for d in listed.data] == [0, 1]
    assert p.proxy.pool.backends[1].prefill_tokens > 0  # the answers' usage fed the prefill accounting


async def test_rerank_through_the_proxy_ranks_the_document_holding_the_query_first(
        llamas, proxy_for: ProxyFactory) -> None:
    p = await proxy_for([await llamas(RERANKER, embedding=True, pooling="rank")])
    documents = ["Paris is the capital of France.", "Machine learning is a field of artificial intelligence.",
                 "A machine uses power to apply forces."]
    async with aiohttp.ClientSession() as s:
        for path in ("/v1/rerank", "/rerank"):
            status, _, body = await _post(s, p.url + path, {"query": "Machine learning is", "documents": documents,
                                                            "top_n": 2})
            assert status == 200, body
            assert [r["index"] for r in body["results"]] == [1, 2]
            assert body["results"][0]["relevance_score"] > body["results"][1]["relevance_score"]
        status, _, tei = await _post(s, p.url + "/rerank", {"query": "Machine learning is", "texts": documents,
                                                             "return_text": True})
        assert status == 200 and tei[0] == {**tei[0], "index": 1, "text": documents[1]}


async def test_native_embeddings_go_only_to_llama_server_and_a_fleet_without_one_gets_404(
        llamas, proxy_for: ProxyFactory) -> None:
    vllm = await start_vllm(VllmServeConfig(model="llama-3.1-8b", served_model_name=EMBEDDER, port=0,
                                            max_model_len=4096), cold_start=False)
    try:
        vllm_spec = BackendSpec(f"http://127.0.0.1:{vllm.port}", "vllm")
        mixed = await proxy_for([vllm_spec, await llamas(embedding=True)])
        only_vllm = await proxy_for([vllm_spec])
        async with aiohttp.ClientSession() as s:
            for _ in range(3):  # least-load ties go to the first backend, the vLLM one: it is skipped
                status, backend, _ = await _post(s, mixed.url + "/embeddings", {"content": "hello"})
                assert status == 200 and backend != vllm_spec.url
            status, backend, body = await _post(s, only_vllm.url + "/embeddings", {"content": "hello"})
            assert (status, backend, body["error"]["code"]) == (404, "", "route_not_found")
    finally:
        await vllm.close()


async def test_bad_pooling_bodies_get_the_proxys_4xx_without_reaching_a_backend(
        llamas, proxy_for: ProxyFactory) -> None:
    # llama-server answers to any model name: declared models are what makes one unknown
    p = await proxy_for([replace(await llamas(embedding=True), models=("embedder",))])
    cases = [("/v1/embeddings", b"{not json", 400), ("/v1/embeddings", b'{"model": "m"}', 400),
             ("/v1/embeddings", b'{"input": "x", "model": 3}', 400),
             ("/v1/embeddings", b'{"input": "x", "model": "no-such-model"}', 404),
             ("/rerank", b'{"query": "q", "documents": []}', 400), ("/v1/rerank", b'{"documents": ["d"]}', 400)]
    async with aiohttp.ClientSession() as s:
        for path, data, expected in cases:
            async with s.post(p.url + path, data=data, headers={"Content-Type": "application/json"}) as r:
                body = await r.json()
                assert (r.status, r.headers["x-flotilla-backend"]) == (expected, ""), (path, data, body)
                assert set(body["error"]) >= {"message", "type", "param", "code"}
        # the engine's own refusals pass through: this server has no --reranking
        async with s.post(p.url + "/rerank", json={"query": "q", "documents": ["d"]}) as r:
            assert r.status == 501 and r.headers["x-flotilla-backend"] == p.proxy.pool.backends[0].url


def test_pooling_requests_are_estimated_from_every_input_and_the_query_per_document() -> None:
    info = parse_pooling_request({"input": ["abcd" * 3, [1, 2, 3]], "model": "m"}, "/v1/embeddings", {}, 4.0)
    assert info == RequestInfo(model="m", prompt_tokens=6, max_tokens=0, headers={})
    rerank = parse_pooling_request({"query": "abcd", "texts": ["abcdabcd", "ab"]}, "/rerank", {}, 4.0)
    assert rerank.prompt_tokens == (1 + 2) + (1 + 1)
    with pytest.raises(ProxyError, match="'query' must be a string"):
        parse_pooling_request({"query": 3, "documents": ["d"]}, "/v1/rerank", {}, 4.0)
