from loadgen.runner import RunnerConfig, build_payload
from loadgen.trace import TraceRequest


def test_a_session_id_travels_as_the_openai_user_field_for_session_affinity() -> None:
    cfg = RunnerConfig(target_url="http://127.0.0.1:1")
    req = TraceRequest(timestamp_s=0.0, input_length=8, output_length=4, session_id="s7")
    body = build_payload(req, "hello", "m", cfg)
    assert body["user"] == "s7" and body["max_tokens"] == 4 and body["stream"] is True
    no_session = build_payload(TraceRequest(timestamp_s=0.0, input_length=8, output_length=4), "hi", "m", cfg)
    assert "user" not in no_session
