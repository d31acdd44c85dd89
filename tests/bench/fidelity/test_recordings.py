"""The recordings' comparisons: each kind reads the real recording, finds it like itself, and sees
a change a look-alike could make."""

from __future__ import annotations

import pytest

from bench.fidelity.recordings import compare, recorded, recordings, startup_states


def _states(engine: str) -> set[str]:
    return {s for name, kind in recordings(engine) if kind == "startup" for s in startup_states(recorded(engine, name))}


@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_every_recording_matches_itself_and_has_a_comparison(engine):
    kinds = {name: kind for name, kind in recordings(engine)}
    assert len(kinds) == {"vllm": 22, "llama.cpp": 25}[engine]
    for name, kind in kinds.items():
        if kind != "log":
            assert compare(kind, recorded(engine, name), recorded(engine, name), _states(engine)) == "", name


def test_each_kind_sees_what_a_look_alike_could_get_wrong():
    llama = "llama.cpp"
    startup = recorded(llama, "000b_health_startup_timeline_1ms_poll.txt")
    assert "states" in compare("startup", startup, startup.replace("HTTP 503", "HTTP 500"), _states(llama))
    assert compare("startup", recorded(llama, "000_health_startup_timeline.txt"), startup, _states(llama)) == ""
    transcript = recorded(llama, "032_chat_stream_raw_socket_transcript.http")
    assert "headers" in compare("transcript", transcript, transcript.replace("Connection: close\r\n",
                                                                              "Keep-Alive: timeout=5\r\n"))
    assert "ended" in compare("transcript", transcript, transcript[: transcript.rindex("0\r\n\r\n")])
    delta = recorded("vllm", "035_prefix_cache_counter_delta.txt")
    assert "hits" in compare("delta", delta, delta.replace("0.0 -> 1152.0", "0.0 -> 0.0"))
    timeline = recorded("vllm", "072_concurrency_nonstream_gauge_timeline.txt")
    assert "waiting" in compare("timeline", timeline, timeline.replace("num_requests_waiting 3.0", "num_requests_waiting 0.0"))
    ended = timeline.replace("vllm:generation_tokens_total 516.0", "vllm:generation_tokens_total 99999.0")
    assert "generation_tokens" in compare("timeline", timeline, ended)
    snapshot = recorded("vllm", "071_concurrency_nonstream_metrics_snapshot_during_load.txt")
    assert compare("snapshot", snapshot, snapshot.replace("vllm:num_requests_running{", "vllm:num_running{")) != ""
    per_request = recorded("vllm", "076_concurrency_stream_per_request.txt")
    assert compare("per_request", per_request, per_request.replace("status=200", "status=500")) != ""
    slots = recorded(llama, "080_concurrency_nonstream_slots_during_load.http")
    assert "busy" in compare("slots", slots, slots.replace('"is_processing":true', '"is_processing":false'))
