import asyncio
import itertools
import sys
from collections import defaultdict

import pytest

from loadgen.readers import read_trace
from loadgen.runner import OpenLoopRunner, RunnerConfig, build_payload, scheduled
from loadgen.trace import TraceRequest
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces"


async def test_replaying_a_minute_of_mooncake_at_speedup_10_matches_the_servers_usage(sse_server):
    url, state = sse_server
    state.tokens_per_chunk = 16  # ~56k output tokens: keep the stream cheap on a busy machine
    cfg = RunnerConfig(target_url=url, speedup=10, show_progress=False)
    result = await OpenLoopRunner(cfg).run(read_trace(DATA / "mooncake_conversation.first60s.jsonl"))
    s = result.summary
    assert (s.num_requests, s.num_ok, s.num_failed) == (162, 162, 0)
    assert s.total_prompt_tokens == sum(u["prompt_tokens"] for u in state.usages)
    assert s.total_completion_tokens == sum(u["completion_tokens"] for u in state.usages)
    assert s.total_cached_tokens == sum(u["prompt_tokens_details"]["cached_tokens"] for u in state.usages)
    trace = list(read_trace(DATA / "mooncake_conversation.first60s.jsonl"))
    assert s.total_prompt_tokens == sum(r.input_length for r in trace)
    assert s.total_completion_tokens == sum(r.output_length for r in trace)
    # every request starts with the shared 512-token block 0, so the server saw prefix hits
    assert s.prefix_hit_rate > 0 and s.requests_per_backend == {"replica-0": 162}
    assert s.ttft_s.p50 is not None and s.e2e_s.p99 >= s.e2e_s.p50


async def test_replay_keeps_the_three_second_bursts_scaled_by_speedup(sse_server):
    url, _ = sse_server
    cfg = RunnerConfig(target_url=url, speedup=10, max_requests=65, ignore_eos=False, show_progress=False)
    requests = (TraceRequest(timestamp_s=r.timestamp_s, input_length=64, output_length=2)
                for r in read_trace(DATA / "mooncake_conversation.first60s.jsonl"))
    result = await OpenLoopRunner(cfg).run(requests)
    ticks = defaultdict(list)
    for rec in result.requests:
        ticks[round(rec.scheduled_time_s, 1)].append(rec.send_time_s)
    assert sorted(ticks) == [0.0, 0.3, 0.6, 0.9, 1.2, 1.5, 1.8]
    assert [len(v) for _, v in sorted(ticks.items())] == [10, 16, 3, 9, 8, 15, 4]
    for tick, sends in ticks.items():
        # a burst leaves together, at its tick, not spread out by earlier requests
        assert tick - 0.001 <= min(sends) and max(sends) < tick + 0.15


# runs in its own process and reports how late its own 5 ms timer wakes, to tell the machine's noise apart
TIMER_PROBE = """
import sys, time
print("ready", flush=True)
late = []
start = time.perf_counter()
for i in range(1, int(float(sys.argv[1]) / 0.005)):
    due = start + i * 0.005
    time.sleep(max(0.0, due - time.perf_counter()))
    late.append(time.perf_counter() - due)
late.sort()
print(late[int(0.9 * len(late))])
"""


@pytest.mark.serial  # asserts on lateness/terminal answers under load: needs the machine to itself
async def test_sends_keep_to_the_schedule_open_loop_at_200_rps_with_a_slow_backend(
        slow_sse_server_process):
    # the server runs in its own process and holds every request for a second (2 tokens, 0.5 s each);
    # few tokens keep the client's own work small, so what is measured is the dispatcher
    cfg = RunnerConfig(target_url=slow_sse_server_process, show_progress=False)
    requests = [TraceRequest(timestamp_s=i / 200, input_length=32, output_length=2) for i in range(300)]
    probe = await asyncio.create_subprocess_exec(sys.executable, "-c", TIMER_PROBE, "2.5",
                                                 stdout=asyncio.subprocess.PIPE)
    assert await probe.stdout.readline() == b"ready\n"  # its start-up must not compete with the run
    result = await OpenLoopRunner(cfg).run(requests)
    machine_noise_p90_s = float((await probe.communicate())[0])
    assert result.summary.num_ok == 300
    lateness = sorted(r.lateness_s for r in result.requests)
    assert result.summary.max_lateness_s == lateness[-1]
    # never early; and never held back by the answers: a runner that waited on the one-second
    # responses would be seconds late by request 300. How late, in milliseconds, is a speed figure
    # (a quiet 2-core machine shows a p90 of about 1 ms and a maximum under 5 ms), printed here and
    # not asserted, since a busy machine adds its own scheduling noise on top.
    assert lateness[0] >= -0.001
    p90 = lateness[int(0.9 * len(lateness))]
    ms = [round(1e3 * x, 2) for x in (lateness[len(lateness) // 2], p90, lateness[-1], machine_noise_p90_s)]
    print("lateness ms: p50 {} p90 {} max {}; timer noise p90 {}".format(*ms))
    assert p90 <= 0.25 + 2 * machine_noise_p90_s, (p90, machine_noise_p90_s, lateness[-5:])
    # open loop: when request 200 left, the 199 before it were all still streaming
    assert all(r.e2e_s >= 1.0 for r in result.requests)
    last_sent = result.requests[199].send_time_s
    assert sum(r.send_time_s + r.e2e_s > last_sent for r in result.requests[:199]) == 199


def test_scheduled_times_are_trace_offsets_divided_by_speedup_and_cut_by_duration():
    reqs = [TraceRequest(timestamp_s=t, input_length=1, output_length=1) for t in (100.0, 101.0, 104.0, 110.0)]
    cfg = RunnerConfig(target_url="http://127.0.0.1:1", speedup=2, duration_s=2.0)
    assert [at for at, _ in scheduled(reqs, cfg)] == [0.0, 0.5, 2.0]
    capped = RunnerConfig(target_url="http://127.0.0.1:1", max_requests=2)
    assert len(list(scheduled(itertools.cycle(reqs), capped))) == 2


def test_payload_streams_with_usage_and_sends_lora_as_the_model():
    req = TraceRequest(timestamp_s=0, input_length=4, output_length=0, lora="sql", priority=2)
    body = build_payload(req, "abcd", "base", RunnerConfig(target_url="http://x", endpoint="chat"))
    assert body["model"] == "sql" and body["max_tokens"] == 1 and body["priority"] == 2
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "abcd"}] and "prompt" not in body


@pytest.mark.parametrize(("field", "value"), [("speedup", 0), ("concurrency", 0), ("endpoint", "embeddings")])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RunnerConfig(target_url="http://x", **{field: value})


async def test_an_unreachable_target_is_a_recorded_failure_not_a_crash(unused_tcp_port_factory):
    cfg = RunnerConfig(target_url=f"http://127.0.0.1:{unused_tcp_port_factory()}", model="m", show_progress=False)
    result = await OpenLoopRunner(cfg).run([TraceRequest(timestamp_s=0, input_length=4, output_length=2)])
    assert result.summary.num_failed == 1
    assert result.requests[0].error.startswith("ClientConnectorError")


async def test_a_concurrency_cap_holds_requests_back_and_shows_as_lateness(sse_server):
    url, state = sse_server
    state.token_delay_s = 0.05  # four tokens: each request takes about 0.2 s
    cfg = RunnerConfig(target_url=url, concurrency=2, show_progress=False)
    reqs = [TraceRequest(timestamp_s=0.0, input_length=8, output_length=4) for _ in range(6)]
    result = await OpenLoopRunner(cfg).run(reqs)
    spans = [(r.send_time_s, r.send_time_s + r.e2e_s) for r in result.requests]
    in_flight = max(sum(start <= t < end for start, end in spans) for t, _ in spans)
    assert result.summary.num_ok == 6 and in_flight == 2
    assert sorted(r.lateness_s for r in result.requests)[-1] >= 0.35  # the last pair waited two turns


async def test_the_result_counts_the_time_scales_the_successful_responses_named(sse_server):
    url, state = sse_server
    state.time_scales = ("0.05", "0.05", None, "not-a-number")  # the last two name no usable scale
    cfg = RunnerConfig(target_url=url, show_progress=False)
    reqs = [TraceRequest(timestamp_s=0.0, input_length=8, output_length=2) for _ in range(8)]
    result = await OpenLoopRunner(cfg).run(reqs)
    assert result.summary.num_ok == 8
    assert result.meta["target_time_scales"] == {"0.05": 4, "none": 4}


async def test_failed_requests_name_no_time_scale(unused_tcp_port_factory):
    cfg = RunnerConfig(target_url=f"http://127.0.0.1:{unused_tcp_port_factory()}", model="m", show_progress=False)
    result = await OpenLoopRunner(cfg).run([TraceRequest(timestamp_s=0, input_length=4, output_length=2)])
    assert result.summary.num_failed == 1 and result.meta["target_time_scales"] == {}


def test_the_progress_bar_counts_to_the_workload_size_capped_by_max_requests() -> None:
    from loadgen.runner import progress_total

    def cfg(**kw):
        return RunnerConfig(target_url="http://127.0.0.1:9", **kw)

    assert progress_total(cfg(expected_requests=162)) == 162
    assert progress_total(cfg(expected_requests=162, max_requests=50)) == 50
    assert progress_total(cfg(expected_requests=12, max_requests=50)) == 12
    assert progress_total(cfg(max_requests=50)) == 50 and progress_total(cfg()) is None
