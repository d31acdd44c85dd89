import asyncio
import json
import random
import re
import statistics
import sys

import pytest

from fake_engines.llamacpp.server import start_llama
from fake_engines.vllm.server import start_vllm
from flotilla.testing.engines import llama_config, vllm_config
from flotilla.testing.spec import FleetSpec
from loadgen.readers import read_trace
from proxy.app import start_proxy
from proxy.config import BackendSpec, HealthConfig, ProxyConfig
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
    # a target that names no time scale (a real engine, this test server) is reported as measured
    assert stdout.splitlines()[0] == "times are wall-clock: the target named no time scale"
    assert (result["meta"]["time_base"], result["meta"]["time_scale"]) == ("wall", None)


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
    rc, _, err = await _flotilla("--target", "http://127.0.0.1:9", "--synthetic", "agents:", "--time-scale", "0")
    assert rc == 2 and "--time-scale must be a positive number, got 0" in err and "Traceback" not in err
    rc, _, err = await _flotilla("--target", "http://127.0.0.1:9", "--synthetic", "agents:",
                                 "--time-scale", "0.05", "--wall-time")
    assert rc == 2 and "not allowed with argument" in err


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


# ---- time base: modelled time learnt from the target, over real sockets ----

QUICKSTART = "poisson:rate=5,duration=4,input=512,output=128"
"""The quickstart's second-shell workload, four seconds of it."""


class _Fleet:
    """Look-alike engines of given flavors, GPUs and time scales behind an in-process proxy."""

    def __init__(self) -> None:
        self.engines: list = []
        self.proxy = None

    async def start(self, members: list[tuple[str, str, float]], **engine_options: object) -> str:
        backends = []
        for index, (flavor, gpu, scale) in enumerate(members):
            spec = FleetSpec(flavor=flavor, gpu=gpu, time_scale=scale, engine_options=engine_options)
            start = start_vllm(vllm_config(spec, index), cold_start=False) if flavor == "vllm" else \
                start_llama(llama_config(spec, index), cold_start=False)
            self.engines.append(await start)
            await self.engines[-1].wait_ready()
            backends.append(BackendSpec(url=f"http://127.0.0.1:{self.engines[-1].port}", flavor=flavor,
                                        models=(spec.served_model,)))
        config = ProxyConfig(port=0, policy="round-robin", scrape_interval_s=0.05,
                             health=HealthConfig(interval_s=0.5), backends=backends)
        self.proxy = await start_proxy(config, rng=random.Random(0))
        return str(self.proxy.url)

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.close()
        for engine in self.engines:
            await engine.close()


@pytest.fixture
async def fleet():
    made = _Fleet()
    yield made
    await made.close()


def _table_p50_ms(stdout: str, label: str) -> float:
    return float(re.search(rf"^{label} \(ms\) +[\d.]+ +([\d.]+)", stdout, re.MULTILINE).group(1))


async def test_quickstart_loadgen_through_the_proxy_reports_modelled_time_and_says_so(fleet, tmp_path):
    # the default fleet's shape: two H100 vLLM replicas and an RTX 4090 llama-server, all 20x faster
    url = await fleet.start([("vllm", "h100", 0.05), ("vllm", "h100", 0.05), ("llamacpp", "rtx4090", 0.05)])
    out = tmp_path / "run.json"
    rc, stdout, stderr = await _flotilla("--target", url, "--synthetic", QUICKSTART, "--output", str(out), "--quiet")
    assert rc == 0, stderr
    assert stdout.splitlines()[0].startswith("times are modelled: measured wall times / 0.05 (time scale from target)")
    result = json.loads(out.read_text())
    assert result["meta"]["time_base"] == "modelled" and result["meta"]["time_scale"] == 0.05
    assert result["meta"]["time_scale_source"] == "target"
    ok = [r for r in result["requests"] if r["ok"]]
    assert result["meta"]["target_time_scales"] == {"0.05": len(ok)} and len(ok) == result["summary"]["num_ok"] > 5
    # an H100 decode step of llama-3.1-8b takes milliseconds; on the wall clock it is a twentieth of that
    vllm_urls = {f"http://127.0.0.1:{e.port}" for e in fleet.engines[:2]}
    h100_tpot_ms = 1000 * statistics.median(r["tpot_s"] for r in ok if r["backend"] in vllm_urls)
    assert h100_tpot_ms > 3.0, h100_tpot_ms
    assert _table_p50_ms(stdout, "TPOT") > 3.0 and _table_p50_ms(stdout, "TTFT") > 3.0, stdout


async def test_engines_with_different_time_scales_are_reported_in_wall_time_and_named(fleet, tmp_path):
    url = await fleet.start([("vllm", "h100", 0.05), ("llamacpp", "rtx4090", 0.1)])
    out = tmp_path / "run.json"
    rc, stdout, stderr = await _flotilla("--target", url, "--synthetic", "poisson:rate=5,duration=2,input=64,output=8",
                                         "--output", str(out), "--quiet")
    assert rc == 0, stderr
    result = json.loads(out.read_text())
    counts = result["meta"]["target_time_scales"]
    assert set(counts) == {"0.05", "0.1"}  # round-robin: both engines served, each named its own
    first = stdout.splitlines()[0]
    assert first.startswith("times are wall-clock: the target's responses named different time scales "
                            f"(0.05 on {counts['0.05']}, 0.1 on {counts['0.1']}); pass --time-scale"), first
    assert (result["meta"]["time_base"], result["meta"]["time_scale"]) == ("wall", None)


async def test_slos_are_judged_in_the_printed_time_base_and_the_flags_choose_it(sse_server, tmp_path):
    url, state = sse_server
    state.time_scales, state.token_delay_s = ("0.01",), 0.01  # ~10 ms per token on the wall: ~1 s modelled
    args = ["--target", url, "--synthetic", "poisson:rate=20,duration=0.5,input=16,output=4", "--slo", "tpot=0.5",
            "--quiet"]
    runs = {}
    for name, flags in (("target", []), ("wall", ["--wall-time"]), ("forced", ["--time-scale", "0.02"])):
        out = tmp_path / f"{name}.json"
        rc, stdout, stderr = await _flotilla(*args, *flags, "--output", str(out))
        assert rc == 0, stderr
        runs[name] = (stdout.splitlines()[0], json.loads(out.read_text()))
    note, modelled = runs["target"]
    assert note.startswith("times are modelled: measured wall times / 0.01 (time scale from target)")
    assert modelled["summary"]["tpot_s"]["p50"] > 0.5 and modelled["summary"]["goodput_per_s"] == 0.0
    note, wall = runs["wall"]
    assert note == "times are wall-clock (--wall-time; the target's time scale is 0.01)"
    assert wall["summary"]["tpot_s"]["p50"] < 0.5
    assert wall["summary"]["goodput_per_s"] == wall["summary"]["request_throughput_per_s"] > 0
    note, forced = runs["forced"]
    assert "wall times / 0.02 (--time-scale; the target said 0.01)" in note
    assert (forced["meta"]["time_base"], forced["meta"]["time_scale"], forced["meta"]["time_scale_source"]) == (
        "modelled", 0.02, "--time-scale")
    rc, stdout, _ = await _flotilla("compare", str(tmp_path / "target.json"), str(tmp_path / "wall.json"))
    assert rc == 0 and stdout.splitlines()[2].split() == ["time", "base", "modelled", "(/0.01)", "wall"]


async def test_vllm_bench_output_with_chosen_percentiles_and_goodput_as_vllm_spells_them(sse_server, tmp_path):
    import hashlib

    url, _ = sse_server
    trace = DATA / "burstgpt.handwritten.csv"
    bench, own = tmp_path / "bench.json", tmp_path / "own.json"
    common = ("--target", url, "--trace", str(trace), "--speedup", "80", "--max-requests", "3", "--duration", "60",
              "--percentiles", "50,99.9", "--quiet")
    rc, stdout, err = await _flotilla(*common, "--goodput", "ttft:5000", "--output", str(bench),
                                      "--output-format", "vllm-bench")
    assert rc == 0, err
    data = json.loads(bench.read_text())
    assert (data["completed"], data["num_prompts"], data["backend"]) == (3, 3, "openai")
    assert {"p50_ttft_ms", "p99.9_ttft_ms", "p99.9_e2el_ms", "std_itl_ms"} <= set(data)
    assert "p90_ttft_ms" not in data and data["request_goodput"] == pytest.approx(data["request_throughput"])
    assert data["flotilla_command"].startswith("flotilla loadgen --target")
    rc, _, err = await _flotilla(*common, "--slo", "ttft=5", "--output", str(own))
    assert rc == 0, err
    result = json.loads(own.read_text())
    meta, ttft = result["meta"], result["summary"]["ttft_s"]
    assert meta["trace_sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    assert meta["flotilla_version"] and meta["started_at"][:2] == "20" and "T" in meta["started_at"]
    assert meta["command"].endswith(f"--output {own}") and meta["time_scale"] is None
    assert list(ttft["percentiles"]) == ["p50", "p99.9"] and ttft["min"] <= ttft["p50"] <= ttft["max"]


async def test_compare_names_columns_by_label_then_by_saved_label(sse_server, tmp_path):
    url, _ = sse_server
    for name in ("a", "b"):
        rc, _, err = await _flotilla("--target", url, "--synthetic", "poisson:rate=50,duration=0.1,input=8,output=2",
                                     "--label", f"run-{name}", "--output", str(tmp_path / f"{name}.json"), "--quiet")
        assert rc == 0, err
    files = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    rc, stdout, _ = await _flotilla("compare", *files)
    assert rc == 0 and stdout.splitlines()[0].split() == ["figure", "run-a", "run-b"]
    rc, stdout, _ = await _flotilla("compare", *files, "--label", "baseline", "--label", "candidate")
    assert rc == 0 and stdout.splitlines()[0].split() == ["figure", "baseline", "candidate"]
    rc, _, err = await _flotilla("compare", *files, "--label", "only-one")
    assert rc == 2 and "--label given 1 times for 2 result files" in err


async def test_a_sweep_against_a_look_alike_engine_rises_then_saturates(fleet, tmp_path):
    # one H100 in real time (its modelled steps, not this busy machine, set the times) running at
    # most 4 sequences: one request at a time is slow, 4 at once share a batch, and the throughput
    # run's 12 wait for those 4 slots. Only effects far larger than this machine's noise are asserted.
    url = await fleet.start([("vllm", "h100", 1.0)], max_num_seqs=4)
    png = tmp_path / "sweep.png"
    rc, stdout, err = await _flotilla("--target", url, "--synthetic", "poisson:rate=10,duration=30,input=256,output=24",
                                      "--max-requests", "12", "--sweep", "2", "--plot", str(png),
                                      "--output", str(tmp_path / "sweep.json"), "--output-format", "vllm-bench",
                                      "--quiet")
    assert rc == 0, err
    rows = [line.split() for line in stdout.splitlines()[3:]]
    assert [r[0] for r in rows][0] == "synchronous" and [r[0] for r in rows][-1] == "throughput"
    assert len(rows) == 4 and all(r[0] == f"constant@{r[1]}" for r in rows[1:3])  # named in modelled req/s
    achieved = [float(r[2]) for r in rows]
    offered = [float(r[1]) for r in rows[1:3]]
    # the constant rates lie strictly between what the synchronous and the throughput runs achieved
    assert all(achieved[0] < rate < achieved[-1] for rate in offered), stdout
    assert achieved[-1] > 2 * achieved[0], stdout  # rises: a shared batch serves far more than one at a time
    e2e_p50 = [float(r[7]) for r in rows]
    # saturates: at full load requests queue for the 4 slots, so the median request takes far longer
    assert e2e_p50[-1] > 1.5 * e2e_p50[0], stdout
    files = sorted(p.name for p in tmp_path.glob("sweep-*.json"))
    assert len(files) == 4 and "sweep-synchronous.json" in files
    sync = json.loads((tmp_path / "sweep-synchronous.json").read_text())
    assert sync["max_concurrency"] == 1 and sync["completed"] == 12
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
