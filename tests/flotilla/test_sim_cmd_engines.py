"""`flotilla sim` simulates the engines that `flotilla up` and `fake-vllm serve` start: every
replica's `meta.engines[i].config` is what that engine prints with --print-config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flotilla.cli import main
from flotilla.fleet import EngineGroup, Fleet, load_fleet_file, without_address
from tests.conftest import REPO

LOAD = "poisson:rate=2,duration=10,input=256,output=16"


def _print_config(argv: list[str]) -> dict:
    """What the engine started by `argv` prints with --print-config (a subprocess, as it runs)."""
    out = subprocess.run([*argv, "--print-config"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _launched(fleet: Fleet, group: EngineGroup) -> list[str]:
    """The command line a replica of `group` is started with by `flotilla up`: the supervisor's
    for fixed groups, the proxy's autoscaler's (its `engine_cmd`) for the scaled one; both
    append --host and --port."""
    if group is fleet.scaled_group():
        assert fleet.autoscaler is not None
        cmd = list(fleet.autoscaler.for_proxy(group)["engine_cmd"])  # type: ignore[call-overload]
    else:
        cmd = without_address(group.command(port=0))
    return [*cmd, "--host", "127.0.0.1", "--port", "18765"]


def _simulated(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    assert main(["sim", "--synthetic", LOAD, "--json", "--no-progress", *argv]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    return run["meta"]["engines"]


def _assert_simulated_as_launched(fleet: Fleet, engines: list[dict]) -> None:
    by_name = {g.name: g for g in fleet.engines}
    printed = {name: _print_config(_launched(fleet, g)) for name, g in by_name.items()}
    assert len(engines) >= len(fleet.started())
    for replica in engines:
        group = by_name[replica["group"]]
        assert replica["flavor"] == group.flavor
        assert replica["config"] == printed[group.name], f"replica of {group.name} differs from its engine"


@pytest.mark.parametrize("group", [
    "{name: big, flavor: vllm, model: llama-3.1-8b, gpu: a100, tensor_parallel: 2, replicas: 2,"
    " args: [--max-num-seqs, '64', --enable-prompt-tokens-details, --seed, '5']}",
    "{name: small, flavor: llamacpp, model: llama-3.2-3b, quant: Q8_0, gpu: l40s, parallel: 2, ctx_size: 16384,"
    " replicas: 2, args: [-b, '1024']}",
])
def test_each_simulated_replica_has_the_config_its_engine_prints_when_flotilla_up_starts_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], group: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(f"engines:\n  - {group}\n")
    fleet = load_fleet_file(path)
    engines = _simulated(capsys, "--fleet", str(path))
    assert len(engines) == 2
    _assert_simulated_as_launched(fleet, engines)


def test_the_default_fleet_is_simulated_as_flotilla_up_starts_it_autoscaled_replicas_included(
        capsys: pytest.CaptureFixture[str]) -> None:
    fleet = load_fleet_file()  # proxy/fleet.default.yaml
    engines = _simulated(capsys, "--fleet", str(REPO / "proxy" / "fleet.default.yaml"))
    assert [e["group"] for e in engines[:3]] == ["llama", "vllm", "vllm"]
    _assert_simulated_as_launched(fleet, engines)


def test_fake_vllm_and_flotilla_sim_resolve_the_same_engine_key_for_key(capsys: pytest.CaptureFixture[str]) -> None:
    fake_vllm = Path(sys.executable).with_name("fake-vllm")  # the installed command
    printed = _print_config([str(fake_vllm), "serve", "llama-3.1-8b", "--gpu", "h100"])
    (replica,) = _simulated(capsys, "--replicas", "1", "--model", "llama-3.1-8b", "--gpu", "h100")
    assert replica["config"] == printed
    # vLLM's own defaults for an H100 through the OpenAI server, and the model's context
    assert (printed["max_num_seqs"], printed["max_num_batched_tokens"], printed["max_model_len"]) == (1024, 8192, 131072)
    assert printed["prefix_caching_hash_algo"] == "sha256"
