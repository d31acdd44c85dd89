"""Every `flotilla plan TOPIC --json` follows one convention: SI base units named in the key."""

from __future__ import annotations

import json

import pytest

from flotilla.cli import main
from flotilla.plan import TOPICS
from flotilla.plan.units import NON_SI_SUFFIXES, si_json

# one --json invocation per topic (the test below fails when a topic is added without one)
RUNS = {
    "fit": ["--model", "llama-3.1-70b", "--gpu", "h100"],
    "tp-demo": [],
    "allreduce": ["--model", "llama-3.1-70b", "-tp", "4"],
    "pipeline": [],
    "experts": ["--route-tokens", "64"],
    "llamacpp-split": ["--layers", "32", "-ngl", "99", "--free-gb", "22,10"],
    "vllm-layout": ["--model", "llama-3.1-8b", "-tp", "2"],
    "choose": ["--model", "llama-3.1-70b", "--gpu", "h100"],
    "lora": ["--model", "llama-3.1-8b"],
    "coldstart": ["--model", "llama-3.1-8b", "--source", "disk=3"],
    "step": ["--model", "llama-3.1-8b", "--gpu", "h100", "--batch", "8"],
    "autoscale": ["--duration", "120"],
    "pd": ["--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "4", "--check", "0"],
}


def _keys(doc, found=None) -> set[str]:
    found = set() if found is None else found
    if isinstance(doc, dict):
        for key, value in doc.items():
            found.add(key)
            _keys(value, found)
    elif isinstance(doc, list):
        for value in doc:
            _keys(value, found)
    return found


def test_every_topic_has_a_json_run_here() -> None:
    assert set(RUNS) == set(TOPICS)


@pytest.mark.parametrize("topic", sorted(RUNS))
def test_json_keys_are_si_with_the_unit_in_the_name(topic: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", topic, *RUNS[topic], "--json"]) == 0
    keys = _keys(json.loads(capsys.readouterr().out))
    assert keys
    assert not [k for k in keys if k.lower().endswith(NON_SI_SUFFIXES)], topic
    assert not [k for k in keys if k.startswith("weight_")], topic  # one spelling: weights_bytes


def test_weights_and_load_bandwidth_are_bytes_and_bytes_per_second(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "coldstart", "--weights-gb", "16", "--source", "disk=0.125", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert (row["weights_bytes"], row["load_bytes_per_s"], row["load_s"]) == (16e9, 0.125e9, 128.0)
    assert main(["plan", "choose", "--weights-gb", "141.2", "--gpu-memory-gb", "80", "--json"]) == 0
    deployment = json.loads(capsys.readouterr().out)["deployment"]
    assert (deployment["weights_bytes"], deployment["gpu_memory_bytes"]) == (pytest.approx(141.2e9), 80e9)


def test_old_flag_spellings_still_work(capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--tp", "4"], ["-tp", "4"], ["--tensor-parallel-size", "4"]):
        assert main(["plan", "allreduce", "--model", "llama-3.1-70b", *flags, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["tp"] == 4
    for flag in ("--size-gb", "--weights-gb"):
        assert main(["plan", "coldstart", flag, "16", "--source", "disk=1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["rows"][0]["weights_bytes"] == 16e9


def test_si_json_converts_nested_keys_and_leaves_the_rest() -> None:
    doc = {"a_ms": 5, "b": [{"x_gb": 2, "weight_bytes": 3}], "n": True, "c_us": 2.0, "label": "16 GB"}
    assert si_json(doc) == {"a_s": 0.005, "b": [{"x_bytes": 2e9, "weights_bytes": 3}], "n": True,
                            "c_s": 2e-6, "label": "16 GB"}
