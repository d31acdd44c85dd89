from __future__ import annotations

import json

import pytest

from flotilla.cli import main

SEED_TABLE = """\
source                      model      load s  total cold start s
Hub download, 1 Gb/s        8B BF16     128.8               188.8
network volume, 1 GB/s      8B BF16      16.1                76.1
local NVMe, 3 GB/s          8B BF16       5.4                65.4
host page cache, 10 GB/s    8B BF16       1.6                61.6
Hub download, 1 Gb/s        70B FP8     564.8               624.8
network volume, 1 GB/s      70B FP8      70.6               130.6
local NVMe, 3 GB/s          70B FP8      23.5                83.5
host page cache, 10 GB/s    70B FP8       7.1                67.1
"""
SEED_BACKLOG = """\
cold start  70 s:   210 requests pile up before new capacity arrives
cold start 600 s:  1800 requests pile up before new capacity arrives
"""
ISSUE_FLAGS = ["--startup-s", "20", "--warmup-s", "40", "--arrival-rate", "5", "--replica-rate", "2",
               "--cold-starts", "70,600"]


def test_seed_example_17_in_full(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "coldstart", "--size-gb", "16.1,70.6", "--labels", "8B BF16,70B FP8", *ISSUE_FLAGS]) == 0
    assert capsys.readouterr().out == SEED_TABLE + SEED_BACKLOG


def test_the_issue_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "coldstart", "--size-gb", "16.1", *ISSUE_FLAGS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "Hub download, 1 Gb/s        16.1 GB     128.8               188.8"
    assert lines[-2:] == SEED_BACKLOG.splitlines()


def test_own_source_and_default_backlogs_use_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "coldstart", "--model", "llama-3.1-70b", "--bits", "8", "--source", "s3 bucket=0.5",
            "--arrival-rate", "5", "--replica-rate", "2", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [round(r["cold_start_s"], 1) for r in doc["rows"]] == [201.2]  # 20 + 70.6 / 0.5 + 40
    assert [round(b["requests"], 1) for b in doc["backlogs"]] == [603.6]


def test_malformed_source_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "coldstart", "--size-gb", "16", "--source", "fast"])
    assert "NAME=GBPS" in capsys.readouterr().err


def test_zero_rate_source_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "coldstart", "--size-gb", "16", "--source", "dead=0"]) == 2
    assert "load_gbps must be > 0" in capsys.readouterr().err


def test_help_says_the_default_rates_are_assumptions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "coldstart", "--help"])
    assert "measure your own" in capsys.readouterr().out


def test_long_names_widen_their_columns(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "coldstart", "--size-gb", "70.6", "--labels", "llama-3.1-70b FP8",
            "--source", "object store in another region=0.5"]
    assert main(argv) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.index("model") == row.index("llama-3.1-70b FP8")
    assert header.index("load s") + len("load s") == row.index("141.2") + len("141.2")


def test_halves_round_up_as_in_the_lesson_printf(capsys: pytest.CaptureFixture[str]) -> None:
    # 0.25 s of load and 60.25 s in all: half-to-even would print 0.2 and 60.2
    assert main(["plan", "coldstart", "--size-gb", "0.25", "--source", "disk=1"]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.split()[-2:] == ["0.3", "60.3"]
