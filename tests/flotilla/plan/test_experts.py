from __future__ import annotations

import json

from flotilla.cli import main

LOADS = "16,18,4,4,6,4,5,7"


def test_issue_command_prints_work_imbalance_and_a_better_placement(capsys):
    assert main(["plan", "experts", "--devices", "4", "--loads", LOADS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "tokens per expert: [16, 18, 4, 4, 6, 4, 5, 7]"
    assert lines[1] == "work per device: [34, 8, 10, 12], max 34 vs mean 16 (imbalance 2.13)"
    assert lines[2].startswith("better placement ") and "max 22 (imbalance 1.38)" in lines[2]


def test_lesson_placement_and_remote_copies_reproduce_example_8(capsys):
    assert main(["plan", "experts", "--devices", "4", "--loads", LOADS, "--placement", "0,7/1,6/2,5/3,4",
                 "--remote-copies", "50"]) == 0
    out = capsys.readouterr().out
    assert "placement {0,7} {1,6} {2,5} {3,4}: work per device [23, 23, 8, 10]" in out
    assert "remote copies 50 of 64; bytes per layer (dispatch + combine, BF16): 800 KiB" in out


def test_redundant_replicas_bring_the_max_below_the_hottest_expert(capsys):
    assert main(["plan", "experts", "--devices", "4", "--loads", LOADS, "--redundant", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["placements"]["replicated"]["max"] < 18 < doc["placements"]["better"]["max"]


def test_experts_not_dividing_over_devices_is_an_error(capsys):
    assert main(["plan", "experts", "--devices", "3", "--loads", LOADS]) == 2
    assert "divide evenly" in capsys.readouterr().err
