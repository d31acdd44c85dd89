from collections import Counter

from loadgen.readers import mooncake
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
