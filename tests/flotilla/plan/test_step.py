from __future__ import annotations

import json

import pytest

from flotilla.cli import main


def _step(capsys, *argv: str) -> dict:
    assert main(["plan", "step", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_issue_decode_command_matches_the_calibration_row(capsys):
    assert main(["plan", "step", "--model", "llama-3.1-8b", "--gpu", "h200", "--batch", "64", "--context", "2048"]) == 0
    out = capsys.readouterr().out
    step_ms = float(next(line for line in out.splitlines() if "step time, ms" in line).split()[-1])
    assert step_ms == pytest.approx(9.2184, rel=0.15)  # measured on an H200


def test_issue_prefill_command_matches_the_calibration_row(capsys):
    doc = _step(capsys, "--model", "llama-3.1-8b", "--gpu", "h200", "--prefill-tokens", "2048")
    assert doc["step_s"] * 1e3 == pytest.approx(51.2492, rel=0.15)


def test_tensor_parallel_over_pcie_shows_the_all_reduce(capsys):
    nv = _step(capsys, "--model", "llama-3.1-70b", "--gpu", "h100", "--batch", "32", "-tp", "4")
    pcie = _step(capsys, "--model", "llama-3.1-70b", "--gpu", "h100", "--batch", "32", "-tp", "4", "--link", "pcie4")
    assert pcie["allreduce_s"] > 5 * nv["allreduce_s"] > 0
    assert isinstance(nv["kv_cache_blocks"], int)


def test_pipeline_interval_is_one_stage(capsys):
    doc = _step(capsys, "--model", "llama-3.1-70b", "--gpu", "h200", "--batch", "8", "-pp", "2")
    assert doc["interval_s"] == pytest.approx(doc["step_s"] / 2, rel=0.01)


def test_weights_that_do_not_fit_report_vllms_message(capsys):
    assert main(["plan", "step", "--model", "llama-3.1-70b", "--gpu", "h100", "--batch", "1"]) == 0
    assert "No available memory for the cache blocks" in capsys.readouterr().out


def test_empty_step_and_unknown_link_are_errors(capsys):
    assert main(["plan", "step", "--model", "llama-3.1-8b"]) == 2
    assert "--batch" in capsys.readouterr().err
    assert main(["plan", "step", "--batch", "1", "--link", "carrier-pigeon"]) == 2
    assert "unknown link 'carrier-pigeon'" in capsys.readouterr().err
