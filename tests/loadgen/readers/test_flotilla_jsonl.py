import io

import pytest

from loadgen.readers import TraceFormatError, flotilla_jsonl, read_trace
from loadgen.trace import TraceRequest
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces"


def test_converting_mooncake_keeps_every_field_through_a_round_trip(tmp_path):
    source = list(read_trace(DATA / "mooncake_conversation.first60s.jsonl"))
    out = tmp_path / "conv.jsonl"
    with out.open("w") as fh:
        assert flotilla_jsonl.write(source, fh) == 162
    assert list(flotilla_jsonl.read(out)) == source


def test_converting_azure_keeps_seconds_and_lengths(tmp_path):
    source = list(read_trace(DATA / "AzureLLMInferenceTrace_conv.before1845.csv"))
    buf = io.StringIO()
    flotilla_jsonl.write(source, buf)
    out = tmp_path / "conv.jsonl"
    out.write_text(buf.getvalue())
    back = list(read_trace(out))
    assert back == source and len(back) == 9754


def test_every_optional_field_is_read():
    reqs = list(flotilla_jsonl.read(DATA / "flotilla.handwritten.jsonl"))
    assert reqs[0] == TraceRequest(timestamp_s=0.0, session_id="agent-1", input_length=1024,
                                   output_length=64, hash_ids=(7, 8), block_tokens=512, lora="sql-lora",
                                   model="llama-3.1-8b", priority=1, service_time_s=2.5)
    assert reqs[1].prompt == "Say hello." and reqs[1].input_length is None


def test_an_unknown_field_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp_s": 0, "output_length": 3, "input_length": 5, "temperature": 1}\n')
    with pytest.raises(TraceFormatError, match=r"bad.jsonl:1: .*'temperature'"):
        list(flotilla_jsonl.read(bad))


def test_a_record_without_prompt_or_input_length_is_rejected(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp_s": 0, "output_length": 3}\n')
    with pytest.raises(TraceFormatError, match="needs prompt or input_length"):
        list(flotilla_jsonl.read(bad))
