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


def test_an_integer_session_id_is_read_as_its_decimal_string(tmp_path):
    trace = tmp_path / "ints.jsonl"
    trace.write_text('{"timestamp_s": 0, "session_id": 0, "input_length": 5, "output_length": 3}\n'
                     '{"timestamp_s": 1, "session_id": "0", "input_length": 5, "output_length": 3}\n')
    assert [r.session_id for r in flotilla_jsonl.read(trace)] == ["0", "0"]


@pytest.mark.parametrize("field,value,message", [
    ("timestamp_s", '"soon"', 'timestamp_s="soon": must be a finite number'),
    ("timestamp_s", "NaN", "timestamp_s=NaN: must be a finite number"),
    ("output_length", "2.5", "output_length=2.5: must be a non-negative integer"),
    ("input_length", '"12"', 'input_length="12": must be a non-negative integer'),
    ("input_length", "-1", "input_length=-1: must be a non-negative integer"),
    ("session_id", "true", "session_id=true: must be a string or an integer"),
    ("session_id", "[1]", "session_id=[1]: must be a string or an integer"),
    ("hash_ids", "[1, \"2\"]", 'hash_ids[1]="2": must be an integer'),
    ("hash_ids", "7", "hash_ids=7: must be a list of integers"),
    ("prompt", "5", "prompt=5: must be a string"),
    ("priority", "1.5", "priority=1.5: must be an integer"),
    ("extra", "[]", "extra=[]: must be an object"),
])
def test_a_field_of_the_wrong_type_is_an_error_naming_file_line_and_field(tmp_path, field, value, message):
    record = {"timestamp_s": "0", "input_length": "5", "output_length": "3", field: value}
    bad = tmp_path / "typed.jsonl"
    good = '{"timestamp_s": 0, "input_length": 5, "output_length": 3}'
    bad.write_text(good + "\n" + "{" + ", ".join(f'"{k}": {v}' for k, v in record.items()) + "}\n")
    with pytest.raises(TraceFormatError) as exc:
        list(flotilla_jsonl.read(bad))
    assert str(exc.value) == f"{bad}:2: bad Flotilla record: {message}"


def test_a_line_that_is_not_an_object_is_an_error_naming_its_line(tmp_path):
    bad = tmp_path / "list.jsonl"
    bad.write_text('{"timestamp_s": 0, "input_length": 5, "output_length": 3}\n[1, 2]\n')
    with pytest.raises(TraceFormatError, match=r"list.jsonl:2: bad Flotilla record: must be a JSON object, not list"):
        list(flotilla_jsonl.read(bad))


def test_every_trace_field_has_a_type_check():
    assert set(flotilla_jsonl._CHECKS) == flotilla_jsonl._FIELDS
