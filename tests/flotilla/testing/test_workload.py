"""Workloads from specs, files and lists, cut and rebased once for every fleet."""

import pytest

from flotilla.testing.workload import ReplayOptions, load_workload
from loadgen.results import Slo
from loadgen.trace import TraceRequest
from tests.conftest import REPO

TRACE = REPO / "tests" / "data" / "traces" / "mooncake_conversation.first60s.jsonl"


def test_a_synthetic_spec_is_drawn_from_the_replay_seed():
    spec = "poisson:rate=5,duration=10,input=100,output=10"
    first, again = load_workload(spec, ReplayOptions(seed=3)), load_workload(spec, ReplayOptions(seed=3))
    other = load_workload(spec, ReplayOptions(seed=4))
    assert first == again and first != other
    assert first[0].timestamp_s == 0.0 and all(r.input_length == 100 for r in first)


def test_agent_sessions_keep_example_16s_shape():
    reqs = load_workload("agents:sessions=6,turns=5,system=2000")
    assert len(reqs) == 30
    assert [r.input_length for r in reqs[:6]] == [4400, 2600, 2600, 2600, 4400, 2600]


def test_a_trace_file_is_cut_by_max_requests_and_duration_then_starts_at_zero():
    whole = load_workload(TRACE)
    cut = load_workload(str(TRACE), ReplayOptions(max_requests=30, duration_s=5.0))
    first_s = whole[0].timestamp_s
    expected = [r for r in whole[:30] if r.timestamp_s - first_s <= 5.0]
    assert len(cut) == len(expected) == 26  # the ticks at 0 s and 3 s
    assert [r.timestamp_s for r in cut] == pytest.approx([r.timestamp_s - first_s for r in expected])
    assert [r.hash_ids for r in cut] == [r.hash_ids for r in expected]


def test_a_list_of_requests_is_replayed_as_given_from_time_zero():
    reqs = [TraceRequest(timestamp_s=t, input_length=8, output_length=2) for t in (5.0, 5.5, 7.0)]
    assert [r.timestamp_s for r in load_workload(reqs)] == [0.0, 0.5, 2.0]
    assert load_workload([]) == []


def test_options_parse_slo_text_and_refuse_unknown_names():
    assert ReplayOptions.from_kwargs(slo="ttft=0.5,e2e=4").slo == Slo(ttft_s=0.5, e2e_s=4.0)
    with pytest.raises(TypeError, match="speedup"):
        ReplayOptions.from_kwargs(speedup=10)
    with pytest.raises(ValueError, match="max_requests"):
        ReplayOptions(max_requests=-1)
