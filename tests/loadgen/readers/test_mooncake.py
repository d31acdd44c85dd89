from collections import Counter

import pytest

from loadgen.readers import TraceFormatError, mooncake
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces"


def test_reads_the_whole_shared_conversation_slice_with_its_published_stats():
    reqs = list(mooncake.read(DATA / "mooncake_conversation_trace.first30min.jsonl"))
    assert len(reqs) == 5719
    assert reqs[-1].timestamp_s == 1797.0
    assert round(sum(r.input_length for r in reqs) / len(reqs)) == 12870
    assert round(sum(r.output_length for r in reqs) / len(reqs)) == 346
    assert all(r.hash_ids[0] == 0 and r.block_tokens == 512 for r in reqs)


def test_hash_ids_cover_input_length_in_512_token_blocks():
    for req in mooncake.read(DATA / "mooncake_synthetic_trace.first510s.jsonl"):
        assert len(req.hash_ids) == -(-req.input_length // 512)


def test_conversation_trace_arrives_in_bursts_on_three_second_ticks():
    times = [r.timestamp_s for r in mooncake.read(DATA / "mooncake_conversation.first60s.jsonl")]
    ticks = sorted(Counter(times).items())
    assert len(times) == 162 and len(ticks) == 20
    assert ticks[0] == (0.0, 10) and ticks[1] == (3.0, 16)
    gaps = [b[0] - a[0] for a, b in zip(ticks, ticks[1:], strict=False)]
    assert all(2.99 <= g <= 3.01 for g in gaps)


def test_synthetic_trace_timestamps_are_milliseconds():
    first = list(mooncake.read(DATA / "mooncake_synthetic.first40rows.jsonl"))[:3]
    assert [r.timestamp_s for r in first] == [0.0, 0.0, 0.04]
    assert (first[0].input_length, first[0].output_length) == (40160, 6)


@pytest.mark.parametrize("line,message", [
    ('{"timestamp": "0", "input_length": 5, "output_length": 3, "hash_ids": [0]}',
     'timestamp="0": must be a finite number'),
    ('{"timestamp": 0, "input_length": 5.5, "output_length": 3, "hash_ids": [0]}',
     "input_length=5.5: must be a non-negative integer"),
    ('{"timestamp": 0, "input_length": 5, "hash_ids": [0]}', "output_length is required"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [0, null]}',
     "hash_ids[1]=null: must be an integer"),
])
def test_a_field_of_the_wrong_type_is_an_error_naming_file_line_and_field(tmp_path, line, message):
    bad = tmp_path / "moon.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [0]}\n\n' + line + "\n")
    with pytest.raises(TraceFormatError) as exc:
        list(mooncake.read(bad))
    assert str(exc.value) == f"{bad}:3: bad Mooncake record: {message}"
