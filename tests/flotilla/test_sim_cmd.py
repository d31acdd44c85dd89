"""`flotilla sim` as users run it: progress on stderr, tables and JSON on stdout, errors by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flotilla.cli import main
from tests.conftest import REPO

EXAMPLE9 = str(REPO / "tests" / "data" / "seed" / "example9.jsonl")


def test_progress_bars_go_to_stderr_one_per_run_and_leave_the_json_clean(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--trace", EXAMPLE9, "--engine", "fixed", "--replicas", "3", "--policy", "round-robin",
            "--policy", "least-outstanding", "--json", "--progress"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert [r["meta"]["policy"] for r in json.loads(out)["runs"]] == ["round-robin", "least-outstanding"]
    assert "run 1/2" in err and "run 2/2" in err
    assert "12/12" in err and "<00:00" in err  # the trace's length is the bar's total: an ETA shows


def test_no_progress_bar_unless_asked_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--trace", EXAMPLE9, "--engine", "fixed", "--replicas", "3"]) == 0
    out, err = capsys.readouterr()
    assert "round-robin" in out and err == ""


def test_a_bad_engine_flag_value_is_an_error_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--trace", EXAMPLE9, "--replicas", "2", "--prefix-caching-hash-algo", "md5"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    # the engine's own parser reads the flag, as fake-vllm serve would
    assert "--prefix-caching-hash-algo" in err and "'md5'" in err and "'sha256', 'builtin'" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_engine_flags_take_the_engines_long_spellings_and_prefix_caching_can_be_switched_off(
        capsys: pytest.CaptureFixture[str]) -> None:
    agents = "agents:sessions=3,turns=3,system=1000,output=16,think=1"
    argv = ["sim", "--synthetic", agents, "--replicas", "1", "--json"]
    assert main(argv) == 0
    cached = json.loads(capsys.readouterr().out)["runs"][0]["meta"]["prompt_tokens_reused"]
    assert main([*argv, "--no-enable-prefix-caching"]) == 0
    assert cached > 0 and json.loads(capsys.readouterr().out)["runs"][0]["meta"]["prompt_tokens_reused"] == 0
    llama = ["sim", "--synthetic", agents, "--replicas", "1", "--engine", "llamacpp", "--gpu", "rtx4090", "--json"]
    assert main([*llama, "--ctx-size", "8192", "--parallel", "2", "--batch-size", "512", "--ubatch-size", "256"]) == 0
    short = capsys.readouterr().out
    assert main([*llama, "-c", "8192", "-np", "2", "-b", "512", "-ub", "256"]) == 0
    assert capsys.readouterr().out == short


def _tpot_mean(out: str) -> float:
    return json.loads(out)["runs"][0]["summary"]["tpot_s"]["mean"]


def test_a_gguf_quantisation_is_timed_as_fake_llama_server_times_it(capsys: pytest.CaptureFixture[str]) -> None:
    from fake_engines.llamacpp import engine
    from fake_engines.llamacpp.config import LlamaServerConfig
    from fake_engines.llamacpp.model import load_model
    from fake_engines.perf.batch import StepBatch
    from sim.build import EngineSpec, replica_factory

    replica = replica_factory(EngineSpec(kind="llamacpp", gpu="rtx4090", quant="Q4_K_M"))(0, None)
    config = LlamaServerConfig(model="llama-3.1-8b-Q4_K_M.gguf", gpu="rtx4090")
    served = engine.step_time_fn(engine.size_engine(config, load_model(config.model)))
    batch = StepBatch(decode_seqs=3, decode_context_tokens=3000)
    assert replica.step_time(batch) == served(batch)
    argv = ["sim", "--synthetic", "poisson:rate=2,duration=10,input=200,output=64", "--replicas", "1",
            "--engine", "llamacpp", "--gpu", "rtx4090", "--json"]
    assert main(argv) == 0
    bf16 = _tpot_mean(capsys.readouterr().out)
    assert main([*argv, "--quant", "Q4_K_M"]) == 0
    assert _tpot_mean(capsys.readouterr().out) < 0.5 * bf16  # a quarter of the weight bytes to read per token


def test_a_quantisation_for_vllm_or_an_unknown_one_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["sim", "--trace", EXAMPLE9, "--replicas", "1"]
    assert main([*base, "--quant", "Q4_K_M"]) == 2
    assert "applies to the llamacpp engine only" in capsys.readouterr().err
    assert main([*base, "--engine", "llamacpp", "--quant", "Q3_X"]) == 2
    err = capsys.readouterr().err
    assert "Q3_X" in err and "Traceback" not in err


def _flotilla_sim(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flotilla", "sim", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_integer_session_ids_run_and_each_session_goes_home(tmp_path: Path) -> None:
    # issue 16: "session_id": 0 crashed with AttributeError 'int' object has no attribute 'lstrip'
    trace = tmp_path / "ints.jsonl"
    trace.write_text("".join(f'{{"timestamp_s": {i * 0.1}, "session_id": {i % 3}, "input_length": 16, '
                             f'"output_length": 2, "service_time_s": 0.01}}\n' for i in range(9)))
    out = _flotilla_sim("--trace", str(trace), "--engine", "fixed", "--replicas", "2",
                        "--policy", "session-affinity:home=modulo", "--json")
    assert out.returncode == 0, out.stderr
    requests = json.loads(out.stdout)["runs"][0]["requests"]
    assert [(r["session_id"], r["backend"]) for r in requests[:3]] == [("0", "0"), ("1", "1"), ("2", "0")]
    assert all(r["ok"] and int(r["backend"]) == int(r["session_id"]) % 2 for r in requests)


@pytest.mark.parametrize("body,cause", [
    ('{"timestamp_s": 0, "session_id": 1.5, "input_length": 16, "output_length": 2}',
     "session_id=1.5: must be a string or an integer"),
    ('{"timestamp_s": 0, "input_length": "16", "output_length": 2}', 'input_length="16"'),
    ('{"timestamp_s": 0, "input_length": 16, "output_length": 2', "bad Flotilla record"),
])
def test_a_bad_trace_line_is_one_line_naming_file_line_and_field(tmp_path: Path, body: str, cause: str) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp_s": 0, "input_length": 16, "output_length": 2}\n' + body + "\n")
    out = _flotilla_sim("--trace", str(trace), "--engine", "fixed", "--replicas", "2", "--format", "flotilla")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"flotilla sim: error: {trace}:2: ") and cause in out.stderr


def test_a_trace_that_is_a_directory_is_a_one_line_error(tmp_path: Path) -> None:
    out = _flotilla_sim("--trace", str(tmp_path), "--engine", "fixed")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and str(tmp_path) in out.stderr


def test_a_fleet_file_runs_its_own_unlike_engines_weighed_and_routed_as_flotilla_up_does(
        capsys: pytest.CaptureFixture[str]) -> None:
    fleet = str(REPO / "proxy" / "fleet.default.yaml")
    argv = ["sim", "--fleet", fleet, "--synthetic", "poisson:rate=0.2,duration=100,input=512,output=64,system=1000",
            "--json"]
    assert main(argv) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert (run["meta"]["policy"], run["meta"]["replicas"]) == ("prefix-capacity", 3)  # the file's policy
    served = [len(r) for r in run["meta"]["requests_per_replica"]]
    assert served[0] < min(served[1:])  # the RTX 4090 llama-server, listed first, takes the least


def _fleet_runs(capsys: pytest.CaptureFixture[str], *extra: str, load: str = "poisson:rate=12,duration=240") -> list:
    argv = ["sim", "--fleet", str(REPO / "proxy" / "fleet.default.yaml"), "--synthetic", f"{load},input=512,output=64",
            "--json", *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["runs"]


def test_a_fleet_file_scales_its_scaled_group_with_its_own_autoscaler_within_min_and_max(
        capsys: pytest.CaptureFixture[str]) -> None:
    (run,) = _fleet_runs(capsys)
    meta = run["meta"]
    assert run["meta"]["label"] == "prefix-capacity + cold-start-aware:capacity_rps=1"  # the file's two policies
    assert meta["autoscale"] == "cold-start-aware" and meta["replicas_launched"] > 3
    groups = [e["group"] for e in meta["engines"]]
    assert groups[:3] == ["llama", "vllm", "vllm"] and set(groups[3:]) == {"vllm"}  # only the vllm group scales
    assert meta["peak_ready_replicas"] <= 1 + 4  # the llama-server, and the vllm group's max


def test_policy_and_autoscale_flags_override_the_fleet_files(capsys: pytest.CaptureFixture[str]) -> None:
    (run,) = _fleet_runs(capsys, "--policy", "round-robin", "--autoscale", "seed:capacity_rps=1",
                         load="poisson:rate=1,duration=20")
    assert run["meta"]["label"] == "round-robin + seed:capacity_rps=1" and run["meta"]["autoscale"] == "seed"


def test_no_autoscale_keeps_a_fleet_file_at_its_starting_size(capsys: pytest.CaptureFixture[str]) -> None:
    (run,) = _fleet_runs(capsys, "--no-autoscale")
    assert run["meta"]["label"] == "prefix-capacity" and "autoscale" not in run["meta"]
    assert run["meta"]["replicas_launched"] == 3


def test_side_by_side_autoscalers_report_what_each_fleet_cost_and_its_slo_attainment(tmp_path: Path) -> None:
    # Hand-checked. One replica serves one request at a time for its service time (engine fixed),
    # 2 GPUs each (-tp 2). A and B arrive at 0 for 1 s each: A's first token at 1 s, B's at 2 s
    # (over the 1.5 s SLO); C arrives at 10 s and is done at 11 s, the run's end.
    trace = tmp_path / "three.jsonl"
    trace.write_text("".join(f'{{"timestamp_s": {t}, "input_length": 16, "output_length": 1, '
                             f'"service_time_s": 1}}\n' for t in (0, 0, 10)))
    out = _flotilla_sim("--trace", str(trace), "--engine", "fixed", "-tp", "2", "--replicas", "1",
                        "--policy", "least-outstanding", "--autoscale", "none",
                        "--autoscale", "seed:capacity_rps=0.2,target_utilization=1,interval_s=5",
                        "--cold-start", "3", "--slo", "ttft=1.5", "--json")
    assert out.returncode == 0, out.stderr
    fixed, scaled = json.loads(out.stdout)["runs"]
    # B missed: 2 of the 3 sent requests met the SLO, whatever the fleet
    assert fixed["summary"]["slo_attainment"] == scaled["summary"]["slo_attainment"] == pytest.approx(2 / 3)
    # the fixed replica is paid from 0 to 11 s
    assert fixed["meta"]["label"] == "least-outstanding + none"
    assert (fixed["meta"]["replica_seconds"], fixed["meta"]["gpu_seconds"]) == (pytest.approx(11), pytest.approx(22))
    assert fixed["meta"]["scale_events"] == [] and fixed["meta"]["cold_starts"] == 0
    # the seed rule sees 2 arrivals in its first 5 s: ceil(0.4 / 0.2) = 2 replicas, so one more is
    # launched at 5 s and paid for from then (its 3 s cold start included) to 11 s: 11 + 6
    assert (scaled["meta"]["replica_seconds"], scaled["meta"]["gpu_seconds"]) == (pytest.approx(17), pytest.approx(34))
    assert scaled["meta"]["cold_starts"] == 1
    [event] = scaled["meta"]["scale_events"]
    assert (event["at_s"], event["direction"], event["from_replicas"], event["to_replicas"], event["reason"]) == (
        5.0, "up", 1, 2, "scale-up")


def test_the_comparison_table_and_pareto_plot_show_cost_against_slo(tmp_path: Path) -> None:
    pareto = tmp_path / "pareto.png"
    out = _flotilla_sim("--trace", EXAMPLE9, "--engine", "fixed", "--replicas", "2", "--autoscale", "none",
                        "--autoscale", "kpa", "--cold-start", "5", "--slo", "ttft=1", "--pareto", str(pareto))
    assert out.returncode == 0, out.stderr
    head, _, *rows = out.stdout.splitlines()
    assert all(word in head for word in ("SLO met", "replica-s", "GPU-s", "up/down", "cold"))
    assert rows[0].startswith("round-robin + none") and rows[1].startswith("round-robin + kpa")
    assert pareto.stat().st_size > 10_000


def test_sim_writes_vllm_bench_and_csv_results_with_chosen_percentiles_and_provenance(tmp_path: Path) -> None:
    import csv
    import hashlib

    base = ["sim", "--trace", EXAMPLE9, "--engine", "fixed", "--replicas", "3", "--percentiles", "50,99.9"]
    assert main([*base, "--output", str(tmp_path / "b"), "--output-format", "vllm-bench"]) == 0
    bench = json.loads((tmp_path / "b-round-robin.json").read_text())
    assert bench["completed"] == 12 and bench["backend"] == "flotilla-sim" and bench["model_id"] == "llama-3.1-8b"
    assert {"p50_ttft_ms", "p99.9_ttft_ms", "std_e2el_ms"} <= set(bench) and "p99_ttft_ms" not in bench
    assert main([*base, "--output", str(tmp_path / "c"), "--output-format", "csv"]) == 0
    rows = list(csv.DictReader((tmp_path / "c-round-robin.csv").open()))
    (summary,) = csv.DictReader((tmp_path / "c-round-robin.summary.csv").open())
    assert len(rows) == 12 and float(summary["ttft_s.p99.9"]) >= float(summary["ttft_s.p50"])
    assert summary["meta.trace_sha256"] == hashlib.sha256(Path(EXAMPLE9).read_bytes()).hexdigest()
    assert summary["meta.time_base"] == "virtual" and summary["meta.command"].startswith("flotilla sim --trace")
