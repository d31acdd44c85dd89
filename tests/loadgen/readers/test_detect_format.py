import gzip

import pytest

from loadgen.readers import TraceFormatError, detect_format, read_trace
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces"


@pytest.mark.parametrize(("name", "fmt"), [
    ("mooncake_conversation_trace.first30min.jsonl", "mooncake"),
    ("mooncake_synthetic_trace.first510s.jsonl", "mooncake"),
    ("AzureLLMInferenceTrace_code.before1845.csv", "azure"),
    ("AzureLLMInferenceTrace_conv.before1845.csv", "azure"),
])
def test_each_shared_sample_is_recognised_from_its_first_line(name, fmt):
    assert detect_format(DATA / name) == fmt


def test_flotilla_jsonl_is_recognised():
    assert detect_format(DATA / "flotilla.handwritten.jsonl") == "flotilla"


def test_gzipped_traces_stream_the_same_requests(tmp_path):
    plain = DATA / "azure_conv.first50rows.csv"
    packed = tmp_path / "azure.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert list(read_trace(packed)) == list(read_trace(plain))
    assert len(list(read_trace(packed))) == 50


def test_an_unknown_file_asks_for_format(tmp_path):
    odd = tmp_path / "odd.txt"
    odd.write_text("hello\n")
    with pytest.raises(TraceFormatError, match="--format"):
        detect_format(odd)
    with pytest.raises(ValueError, match="unknown trace format 'nope'"):
        read_trace(odd, "nope")
