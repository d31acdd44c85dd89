"""The fake llama-server's embedding and rerank routes over real sockets: the openai SDK, base64,
the native shape, the engine's accounting of prompt-only tasks, and the routes' 501s and 400s."""

from __future__ import annotations

import base64
import struct

import openai

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.server import start_llama
from tests.fake_engines.client import post_json
from tests.fake_engines.engine_thread import EngineThread
from tests.fake_engines.scrape import fetch_text, value

EMBEDDER = "bge-small-en-v1.5-F16.gguf"


def _server(model: str, **flags: object) -> EngineThread:
    config = LlamaServerConfig(model=model, port=0, time_scale=0.01, metrics=True, n_parallel=2, n_ctx=1024, **flags)
    return EngineThread(lambda: start_llama(config, cold_start=False))


def test_embeddings_in_every_shape_are_the_same_vectors_and_count_as_prompt_work():
    text = "I believe the meaning of life is"
    with _server(EMBEDDER, embedding=True) as engine:
        client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key="x")
        listed = client.embeddings.create(model="any", input=[text, text, "something else entirely"])
        vectors = [d.embedding for d in listed.data]
        assert len(vectors[0]) == 384 and vectors[0] == vectors[1] != vectors[2]
        assert listed.model == "any" and listed.usage.prompt_tokens == listed.usage.total_tokens == 2 * 9 + 7
        status, raw = post_json(engine.base_url, "/v1/embeddings", {"input": text, "encoding_format": "base64"})
        decoded = struct.unpack("<384f", base64.b64decode(raw["data"][0]["embedding"]))
        assert status == 200 and raw["data"][0]["encoding_format"] == "base64"
        assert max(abs(a - b) for a, b in zip(decoded, vectors[0], strict=True)) < 1e-6
        for path in ("/embeddings", "/embedding"):  # native: a list of vectors per input, no usage
            status, native = post_json(engine.base_url, path, {"content": text})
            assert status == 200 and native == [{"index": 0, "embedding": [vectors[0]]}]
        status, content = post_json(engine.base_url, "/v1/embeddings", {"content": text})  # "content": native answer
        assert status == 200 and isinstance(content, list)
        metrics = fetch_text(engine.base_url)
        assert value(metrics, "llamacpp:prompt_tokens_total") == 2 * 9 + 7 + 3 * 9 + 9
        assert value(metrics, "llamacpp:tokens_predicted_total") == 0  # nothing decoded
        status, error = post_json(engine.base_url, "/v1/embeddings", {"input": "This is a test " * 512})
        assert status == 500 and "too large to process" in error["error"]["message"]


def test_pooling_none_gives_a_vector_per_token_natively_and_is_refused_on_the_openai_route():
    with _server(EMBEDDER, embedding=True, pooling="none") as engine:
        status, native = post_json(engine.base_url, "/embeddings", {"input": "hello hello hello"})
        assert status == 200 and len(native[0]["embedding"]) == 1 + 5  # BOS and the text's tokens
        status, error = post_json(engine.base_url, "/v1/embeddings", {"input": "hello"})
        assert status == 400 and "Pooling type 'none' is not OAI compatible" in error["error"]["message"]


def test_rerank_scores_every_document_best_first_on_each_of_its_paths():
    documents = ["Paris is in France.", "Machine learning is a field of AI.", "A machine applies forces."]
    with _server("jina-reranker-v1-tiny-en-F16.gguf", embedding=True, pooling="rank") as engine:
        for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
            status, body = post_json(engine.base_url, path, {"query": "Machine learning is", "documents": documents})
            assert status == 200 and [r["index"] for r in body["results"]][0] == 1, path
        status, error = post_json(engine.base_url, "/rerank", {"query": "q", "documents": [1, 2]})
        assert status == 400 and error["error"]["message"] == '"documents" must be a non-empty string array'


def test_without_their_flags_the_routes_answer_501_with_llama_servers_hint():
    with _server("llama-3.2-1b-Q8_0.gguf") as engine:
        status, error = post_json(engine.base_url, "/v1/embeddings", {"input": "x"})
        assert (status, error["error"]["type"]) == (501, "not_supported_error")
        assert "Start it with `--embeddings`" in error["error"]["message"]
        status, error = post_json(engine.base_url, "/rerank", {"query": "q", "documents": ["d"]})
        assert status == 501 and "Start it with `--reranking`" in error["error"]["message"]
        # a generative model without --pooling pools nothing: not OpenAI-compatible
    with _server("llama-3.2-1b-Q8_0.gguf", embedding=True) as engine:
        status, error = post_json(engine.base_url, "/v1/embeddings", {"input": "x"})
        assert status == 400 and "Pooling type 'none'" in error["error"]["message"]


def test_embedding_servers_batch_no_more_than_a_ubatch_as_llama_server_sets_them():
    assert LlamaServerConfig(model=EMBEDDER, embedding=True, n_batch=2048, n_ubatch=128).n_batch == 128
    assert LlamaServerConfig(model=EMBEDDER, n_batch=2048, n_ubatch=128).n_batch == 2048
