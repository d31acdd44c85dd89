"""`flotilla sim --prefill-replicas N --decode-replicas M`: a P/D fleet beside a colocated one."""

from __future__ import annotations

import json

import pytest

from flotilla.cli import main
from tests.conftest import REPO

TRACE = str(REPO / "tests" / "data" / "traces" / "azure_conv.first50rows.csv")


def test_sim_prints_colocated_and_pd_fleets_per_link_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--trace", TRACE, "--max-requests", "20", "--prefill-replicas", "1", "--decode-replicas", "1",
            "--kv-link", "nvlink", "--kv-link", "pcie4", "--slo", "ttft=2,tpot=0.1"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    for label in ("colocated x2", "P/D 1:1 nvlink", "P/D 1:1 pcie4"):
        assert label in table
    assert "TPOT p99" in table and "per GPU" in table
    assert main([*argv, "--json", "--colocated-replicas", "0"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["meta"]["pd"]["kv_link"] for r in runs] == ["nvlink", "pcie4"]
    nvlink, pcie4 = (r["meta"]["kv_transfer"] for r in runs)
    assert nvlink["bytes_per_gpu"] == pcie4["bytes_per_gpu"] > 0 and nvlink["mean_s"] < pcie4["mean_s"]


def test_pd_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--trace", TRACE, "--prefill-replicas", "1"]) == 2
    assert "needs both --prefill-replicas and --decode-replicas" in capsys.readouterr().err
    assert main(["sim", "--trace", TRACE, "--prefill-replicas", "1", "--decode-replicas", "1",
                 "--engine", "llamacpp"]) == 2
    assert "vLLM fleet" in capsys.readouterr().err


def test_a_fleet_file_with_prefill_and_decode_groups_runs_as_a_pd_fleet(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    fleet = tmp_path / "pd.yaml"
    fleet.write_text("engines:\n"
                     "  - {flavor: vllm, model: llama-3.1-8b, name: p, role: prefill, replicas: 1}\n"
                     "  - {flavor: vllm, model: llama-3.1-8b, name: d, role: decode, replicas: 2, "
                     "args: [--kv-link, pcie4]}\n")
    assert main(["sim", "--fleet", str(fleet), "--trace", TRACE, "--max-requests", "10", "--json"]) == 0
    colocated, pd = json.loads(capsys.readouterr().out)["runs"]
    assert colocated["meta"]["label"] == "colocated x3" and colocated["meta"]["gpus"] == 3
    assert pd["meta"]["label"] == "P/D 1:2 pcie4" and pd["meta"]["gpus"] == 3  # the decode group's --kv-link
    assert pd["meta"]["pd"]["prefill_policy"] == "prefix-aware"
