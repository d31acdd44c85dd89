import asyncio
import json
import sys

import pytest

from loadgen.readers import read_trace
from tests.conftest import REPO
from tests.loadgen.sse_server import SseServerState, make_app

DATA = REPO / "tests" / "data" / "traces"


@pytest.fixture
async def sse_server(aiohttp_server):
    state = SseServerState()
    server = await aiohttp_server(make_app(state), host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}", state


async def _flotilla(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "loadgen", *args, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode, out.decode(), err.decode()


async def test_agents_replay_writes_results_table_and_plot_with_example_16_token_totals(sse_server, tmp_path):
    url, state = sse_server
    out, png = tmp_path / "agents.json", tmp_path / "agents.png"
    rc, stdout, stderr = await _flotilla(
        "--target", url, "--synthetic", "agents:sessions=6,turns=5,system=2000,think=0.5,stagger=0.02",
        "--slo", "ttft=5,tpot=1", "--output", str(out), "--plot", str(png), "--quiet")
    assert rc == 0, stderr
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["num_ok"] == 30 and summary["total_prompt_tokens"] == 168000
    assert summary["total_prompt_tokens"] == sum(u["prompt_tokens"] for u in state.usages)
    assert summary["total_completion_tokens"] == 30 * 64 == sum(u["completion_tokens"] for u in state.usages)
    assert summary["goodput_per_s"] == summary["request_throughput_per_s"]
    assert summary["prefix_hit_rate"] > 0.4  # later turns reuse their session's earlier prompt
    assert {r["session_id"] for r in result["requests"]} == {f"agent-{i}" for i in range(6)}
    assert "TTFT (ms)" in stdout and "goodput (req/s)" in stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_convert_then_replay_the_converted_trace_gives_the_same_requests(tmp_path):
    out = tmp_path / "conv.flotilla.jsonl"
    rc, _, stderr = await _flotilla("convert", str(DATA / "mooncake_conversation.first60s.jsonl"), str(out))
    assert rc == 0 and "wrote 162 requests" in stderr
    assert list(read_trace(out)) == list(read_trace(DATA / "mooncake_conversation.first60s.jsonl"))


async def test_compare_prints_one_column_per_run(sse_server, tmp_path):
    url, _ = sse_server
    for name, speedup in (("slow", "40"), ("fast", "80")):
        rc, _, err = await _flotilla("--target", url, "--trace", str(DATA / "burstgpt.handwritten.csv"),
                                     "--speedup", speedup, "--max-requests", "2", "--duration", "60",
                                     "--output", str(tmp_path / f"{name}.json"), "--quiet")
        assert rc == 0, err
    rc, stdout, _ = await _flotilla("compare", str(tmp_path / "slow.json"), str(tmp_path / "fast.json"))
    assert rc == 0
    header, _, *rows = stdout.splitlines()
    assert header.split() == ["figure", "slow", "fast"]
    assert any(row.split()[:5] == ["requests", "ok", "/", "sent", "2/2"] for row in rows)


async def test_bad_input_is_an_error_message_not_a_traceback(tmp_path):
    rc, _, err = await _flotilla("--target", "http://127.0.0.1:9", "--synthetic", "zipf:rate=1")
    assert rc == 2 and "error: unknown synthetic workload 'zipf'" in err and "Traceback" not in err
    rc, _, err = await _flotilla("--synthetic", "agents:")
    assert rc == 2 and "--target URL is required" in err
    rc, _, err = await _flotilla("convert", str(tmp_path / "missing.jsonl"), str(tmp_path / "o.jsonl"))
    assert rc == 2 and "No such file" in err and "Traceback" not in err


async def test_convert_with_jitter_smooths_the_mooncake_ticks_reproducibly(tmp_path):
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for out in outs:
        rc, _, err = await _flotilla("convert", "--jitter", "3", "--seed", "1",
                                     str(DATA / "mooncake_conversation.first60s.jsonl"), str(out))
        assert rc == 0, err
    times = [r.timestamp_s for r in read_trace(outs[0])]
    assert len(set(times)) == 162 and times == sorted(times)
    assert outs[0].read_text() == outs[1].read_text()


async def test_a_bad_trace_line_is_one_line_naming_file_line_and_field(sse_server, tmp_path):
    url, _ = sse_server
    trace = tmp_path / "ints.jsonl"
    trace.write_text('{"timestamp_s": 0, "session_id": 0, "input_length": 8, "output_length": 2}\n'
                     '{"timestamp_s": 0.01, "session_id": [0], "input_length": 8, "output_length": 2}\n')
    for args in (["--target", url, "--model", "m", "--trace", str(trace), "--quiet"],
                 ["convert", str(trace), str(tmp_path / "out.jsonl")]):
        rc, _, err = await _flotilla(*args)
        assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err
        assert err == f"flotilla loadgen: error: {trace}:2: bad Flotilla record: session_id=[0]: " \
                      "must be a string or an integer\n"
