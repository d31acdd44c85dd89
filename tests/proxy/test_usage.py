from proxy.usage import Usage, drop_usage_events, usage_from_json, usage_from_sse_tail
from tests.conftest import DATA

REAL = DATA / "real-engines"


def _body(rel: str) -> bytes:
    raw = (REAL / rel).read_bytes().replace(b"\r\n", b"\n")
    return raw.split(b"\n\n", 1)[1]


def test_usage_of_a_non_streamed_vllm_answer() -> None:
    usage = usage_from_json(b'{"usage":{"prompt_tokens":11,"completion_tokens":71,'
                            b'"prompt_tokens_details":{"cached_tokens":8}}}')
    assert usage == Usage(prompt_tokens=11, cached_tokens=8, reports_cache=True) and usage.prefill_tokens == 3


def test_usage_chunk_at_the_end_of_a_real_llama_server_stream() -> None:
    usage = usage_from_sse_tail(_body("llama.cpp/021_chat_stream_include_usage.http")[-8192:])
    assert usage == Usage(prompt_tokens=19, cached_tokens=18, reports_cache=True)


def test_a_usage_without_cache_details_says_the_engine_did_not_report_it() -> None:
    # vLLM without --enable-prompt-tokens-details: prompt_tokens_details is null, not 0 hits
    usage = usage_from_json(b'{"usage":{"prompt_tokens":11,"prompt_tokens_details":null}}')
    assert usage == Usage(prompt_tokens=11, cached_tokens=0, reports_cache=False)


def test_a_stream_without_usage_gives_none() -> None:
    assert usage_from_sse_tail(b'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n') is None


def test_usage_only_events_are_dropped_and_everything_else_kept() -> None:
    chunk = (b'data: {"choices":[{"text":"a"}],"usage":null}\n\n'
             b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\ndata: [DONE]\n\n')
    assert drop_usage_events(chunk) == b'data: {"choices":[{"text":"a"}],"usage":null}\n\ndata: [DONE]\n\n'
    assert drop_usage_events(b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\n') == b""
    assert drop_usage_events(b'data: {"choices":[{"text":"usage"}]}\n\n') == b'data: {"choices":[{"text":"usage"}]}\n\n'
