"""Files that are not text traces: an error naming the file and line, never a decoder traceback."""

import gzip

import pytest

from loadgen.readers import TraceFormatError, read_trace


def test_bytes_that_are_not_utf8_name_the_line(tmp_path):
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(b'{"timestamp_s": 0, "input_length": 5, "output_length": 3}\n\xff\xfe\x00\n')
    with pytest.raises(TraceFormatError, match=r"bin\.jsonl:\d+: not UTF-8 text"):
        list(read_trace(bad, "flotilla"))


def test_a_truncated_gzip_trace_is_a_trace_error(tmp_path):
    whole = gzip.compress(b'{"timestamp_s": 0, "input_length": 5, "output_length": 3}\n' * 100)
    bad = tmp_path / "cut.jsonl.gz"
    bad.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceFormatError, match=r"cut\.jsonl\.gz:\d+: truncated gzip file"):
        list(read_trace(bad, "flotilla"))


def test_a_gz_name_on_plain_text_is_a_trace_error(tmp_path):
    bad = tmp_path / "plain.csv.gz"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceFormatError, match=r"plain\.csv\.gz:1: not a gzip file"):
        list(read_trace(bad, "azure"))
