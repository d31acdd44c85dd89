from __future__ import annotations

import json

import pytest

from flotilla.cli import main

SEED_EXAMPLE_11 = [
    (["-ngl", "99", "-ts", "1,1"], "-ngl 99 -ts 1,1       : GPU0 layers 0-16 (17), GPU1 layers 17-31 (15), output on GPU1"),
    (["-ngl", "99", "-ts", "3,1"], "-ngl 99 -ts 3,1       : GPU0 layers 0-24 (25), GPU1 layers 25-31 (7), output on GPU1"),
    (["-ngl", "99", "--free-gb", "22,10"],
     "-ngl 99, free 22/10 GB: GPU0 layers 0-22 (23), GPU1 layers 23-31 (9), output on GPU1"),
    (["-ngl", "20", "-ts", "1,1"],
     "-ngl 20 -ts 1,1       : CPU layers 0-12 (13), GPU0 layers 13-22 (10), GPU1 layers 23-31 (9), output on GPU1"),
    (["-ngl", "99", "-ts", "1,1,1"],
     "-ngl 99 -ts 1,1,1     : GPU0 layers 0-10 (11), GPU1 layers 11-21 (11), GPU2 layers 22-31 (10), output on GPU2"),
]


@pytest.mark.parametrize(("flags", "line"), SEED_EXAMPLE_11)
def test_each_seed_line_comes_from_the_flags(flags: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llamacpp-split", "--layers", "32", *flags]) == 0
    assert capsys.readouterr().out.splitlines()[0] == line


def test_the_issue_command_prints_the_split_and_the_gpu_share(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llamacpp-split", "--layers", "32", "-ngl", "99", "-ts", "3,1"]) == 0
    out = capsys.readouterr().out
    assert "GPU0 layers 0-24 (25), GPU1 layers 25-31 (7), output on GPU1" in out
    assert "layers on GPUs        : 32 of 32 (100%); GPU0 25, GPU1 7" in out


def test_all_zero_tensor_split_falls_back_to_free_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llamacpp-split", "--layers", "32", "-ts", "0,0", "--free-gb", "22,10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layers_per_gpu"] == [23, 9]


def test_json_from_a_catalogue_model_gives_devices_per_layer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llamacpp-split", "--model", "llama-3.1-70b", "-ngl", "41", "-ts", "1,1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_layer"] == 80 and len(doc["devices"]) == 81
    assert (doc["cpu_layers"], doc["layers_per_gpu"], doc["gpu_layer_fraction"]) == (40, [21, 19], 0.5)
    assert doc["ranges"][0] == {"device": "CPU", "first_layer": 0, "last_layer": 39, "layers": 40}


def test_missing_gpu_proportions_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llamacpp-split", "--layers", "32"]) == 2
    assert "free_bytes is required" in capsys.readouterr().err


def test_malformed_tensor_split_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", "llamacpp-split", "--layers", "32", "-ts", "3,x"])
    assert exc.value.code == 2
    assert "-ts/--tensor-split" in capsys.readouterr().err


def test_help_explains_ngl_and_tensor_split(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "llamacpp-split", "--help"])
    out = capsys.readouterr().out
    assert "-ngl N, --n-gpu-layers N" in out and "free memory of each GPU" in out


def test_split_mode_none_uses_only_the_main_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llamacpp-split", "--layers", "32", "-ngl", "99", "-sm", "none", "-mg", "1",
                 "-ts", "3,1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "-ngl 99 -sm none -mg 1: GPU1 layers 0-31 (32), output on GPU1",
        "layers on GPUs        : 32 of 32 (100%); GPU0 0, GPU1 32",
    ]
