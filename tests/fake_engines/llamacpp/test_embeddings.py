"""Embedding vectors, inputs and rerank results as llama-server computes and shapes them (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from fake_engines.llamacpp.embeddings import (
    check_task_tokens,
    embed,
    parse_embedding_request,
    parse_rerank_request,
    rerank_body,
    rerank_score,
    rerank_tokens,
)
from fake_engines.llamacpp.errors import LlamaError
from fake_engines.llamacpp.vocab import BOS_ID, tokenize


def _vec(text: str, pooling: str = "mean", mode: int = 2) -> np.ndarray:
    return np.array(embed(tokenize(text, True), 384, pooling, mode)[0])


def test_vectors_are_a_function_of_the_tokens_and_similar_texts_lie_closer():
    base = _vec("I believe the meaning of life is to be kind")
    assert base.shape == (384,) and np.array_equal(base, _vec("I believe the meaning of life is to be kind"))
    close = _vec("I believe the meaning of life is to be kind to others")
    far = _vec("Paris est une grande ville européenne")
    assert base @ close > 0.8 > 0.5 > base @ far
    for pooling in ("mean", "cls", "last"):
        assert abs(np.linalg.norm(_vec("some text", pooling)) - 1) < 1e-5  # euclidean by default
    assert abs(np.abs(_vec("some text", mode=1)).sum() - 1) < 1e-4  # taxicab
    assert abs(np.abs(_vec("some text", mode=0)).max() - 32760) < 0.1  # max absolute, int16 range
    assert np.linalg.norm(_vec("some text", mode=-1)) > 2  # no normalisation: a hidden state's norm
    states = embed(tokenize("hello hello hello", True), 384, "none", 2)
    assert len(states) == 1 + 5 and all(abs(np.linalg.norm(s) - 1) > 1e-3 for s in states)  # BOS + 5, raw


@pytest.mark.parametrize(("value", "prompts"), [
    ("", [[BOS_ID]]), ([12, 34, 56], [[12, 34, 56]]),
    ([12, "ab", 56], [[12, *tokenize("ab", False), 56]]),  # BOS only before a leading string
    (["a", [1, 2]], [tokenize("a", True), [1, 2]]), ({"prompt_string": "a"}, [tokenize("a", True)]),
    ([{"content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]}], [tokenize("abcd", True)]),
])
def test_inputs_are_read_as_llama_server_reads_them(value, prompts):
    req = parse_embedding_request({"input": value}, oai=True, default_normalize=2)
    assert req.prompts == prompts
    assert req.oai and not req.base64 and req.normalize == 2


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"input": []}, 400, '"input" must not be empty'),
    ({"input": {"content": "x"}}, 400, '"content" must be an array'),
    ({"input": {"content": [{"type": "unknown"}]}}, 400, "unsupported content[].type"),
    ({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}}, 500,
     "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"),
    ({"input": {"content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]}}, 500, "audio input"),
    ({"input": {"prompt_string": "a", "multimodal_data": ["AAAA"]}}, 500, "Multimodal data provided"),
    ({"input": 3}, 500, '"prompt" elements must be a string'),
    ({"model": "m"}, 400, '"input" or "content" must be provided'),
    ({"input": "x", "encoding_format": "hex"}, 400, "Can be either float or base64"),
    ({"input": "x", "encoding_format": 1}, 500, "type must be string, but is number"),
])
def test_bad_inputs_get_llama_servers_status_and_words(body, status, message):
    with pytest.raises(LlamaError) as err:
        parse_embedding_request(body, oai=True, default_normalize=2)
    assert err.value.status == status and message in err.value.message


def test_a_slot_refuses_invalid_ids_and_prompts_larger_than_a_ubatch_or_its_context():
    check_task_tokens([1, 2, 3], n_ubatch=3, slot_n_ctx=3)
    for ids, ubatch, ctx, status, words in (([-1], 8, 8, 400, "Prompt contains invalid tokens"),
                                            ([1] * 9, 8, 16, 500, "input (9 tokens) is too large to process"),
                                            ([1] * 9, 16, 8, 400, "is larger than the max context size (8 tokens)")):
        with pytest.raises(LlamaError) as err:
            check_task_tokens(ids, ubatch, ctx)
        assert (err.value.status, words in err.value.message) == (status, True)


def test_rerank_ranks_the_documents_holding_the_query_first_and_shapes_jina_and_tei():
    documents = ["A machine uses power.", "Learning is acquiring knowledge.",
                 "Machine learning is a field of artificial intelligence.", "Paris est une grande ville."]
    scores = [rerank_score(*rerank_tokens("Machine learning is", d)) for d in documents]
    assert max(range(4), key=scores.__getitem__) == 2 and min(range(4), key=scores.__getitem__) == 3
    n_tokens = [sum(map(len, rerank_tokens("Machine learning is", d))) for d in documents]
    jina = rerank_body(parse_rerank_request({"query": "Machine learning is", "documents": documents, "top_n": 2}),
                       "m", scores, n_tokens)
    assert [r["index"] for r in jina["results"]] == [2, 1] and jina["usage"]["prompt_tokens"] == sum(n_tokens)
    assert set(jina) == {"model", "object", "usage", "results"} and "text" not in jina["results"][0]
    tei = rerank_body(parse_rerank_request({"query": "q", "texts": documents, "return_text": True}), "m", scores,
                      n_tokens)
    assert tei[0] == {"index": 2, "score": scores[2], "text": documents[2]} and len(tei) == 4
    for documents_value in ([], None, 123, [1, 2, 3]):
        with pytest.raises(LlamaError, match="must be a non-empty string array"):
            parse_rerank_request({"query": "q", "documents": documents_value})
    with pytest.raises(LlamaError, match='"query" must be provided'):
        parse_rerank_request({"documents": ["d"]})
