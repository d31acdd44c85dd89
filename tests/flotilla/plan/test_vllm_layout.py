from __future__ import annotations

import json

import pytest

from flotilla.cli import main

HEADER = "model      flags                                 GPUs  engines  per engine  expert layers"
SEED_EXAMPLE_13 = [
    (["--label", "dense 70B", "-tp", "8"],
     "dense 70B  -tp 8                                    8        1           8  no expert layers"),
    (["--label", "dense 70B", "-tp", "4", "-pp", "2"],
     "dense 70B  -tp 4 -pp 2                              8        1           8  no expert layers"),
    (["--label", "dense 8B", "-tp", "1", "-dp", "8"],
     "dense 8B   -tp 1 -dp 8                              8        8           1  no expert layers"),
    (["--moe", "-tp", "8"],
     "MoE        -tp 8                                    8        1           8  TP=8: every expert split 8 ways"),
    (["--moe", "-tp", "8", "--enable-expert-parallel"],
     "MoE        -tp 8 --enable-expert-parallel           8        1           8  EP=8: each GPU holds 1/8 of the experts"),
    (["--moe", "-dp", "8"],
     "MoE        -tp 1 -dp 8                              8        8           1  TP=8: every expert split 8 ways"),
    (["--moe", "-dp", "8", "--enable-expert-parallel"],
     "MoE        -tp 1 -dp 8 --enable-expert-parallel     8        8           1  EP=8: each GPU holds 1/8 of the experts"),
    (["-tp", "2", "-dp", "4", "--enable-expert-parallel", "--moe"],
     "MoE        -tp 2 -dp 4 --enable-expert-parallel     8        4           2  EP=8: each GPU holds 1/8 of the experts"),
]


@pytest.mark.parametrize(("flags", "line"), SEED_EXAMPLE_13)
def test_each_seed_row_comes_from_the_flags(flags: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "vllm-layout", *flags]) == 0
    assert capsys.readouterr().out.splitlines() == [HEADER, line]


def test_without_moe_the_expert_flag_leaves_a_dense_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "vllm-layout", "-tp", "2", "-dp", "4", "--enable-expert-parallel"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("no expert layers")


def test_catalogue_moe_model_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "vllm-layout", "--model", "qwen3-30b-a3b", "-dp", "8", "-ep", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["moe"], doc["gpus"], doc["engines"], doc["moe_group_gpus"], doc["expert_parallel"]) == (
        True, 8, 8, 8, True)


def test_zero_tensor_parallel_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "vllm-layout", "-tp", "0"]) == 2
    assert "tp must be >= 1" in capsys.readouterr().err


def test_help_names_the_vllm_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "vllm-layout", "--help"])
    out = capsys.readouterr().out
    assert "-tp TP, --tensor-parallel-size TP" in out and "--enable-expert-parallel" in out


def test_long_model_name_widens_the_column_for_header_and_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "vllm-layout", "--model", "qwen3-30b-a3b", "-dp", "8"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.index("flags") == row.index("-tp 1") == len("qwen3-30b-a3b") + 2
    gpus_at = header.index("GPUs")
    assert row[gpus_at:gpus_at + 4] == "   8"
