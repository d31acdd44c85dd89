from __future__ import annotations

import json

import pytest

from flotilla.cli import main

SEED_EXAMPLE_14 = [
    ("8B BF16, 8 x 80 GB NVLink", ["--weights-gb", "16.1", "--gpu-memory-gb", "80", "--nvlink"],
     "needs 1 GPU(s) -> no split, 8 replicas (DP)"),
    ("70B BF16, 8 x 80 GB NVLink", ["--weights-gb", "141.2", "--gpu-memory-gb", "80", "--nvlink"],
     "needs 3 GPU(s) -> TP=4, 2 replicas (DP)"),
    ("32B 4.5-bit, 2 x 24 GB PCIe", ["--weights-gb", "18.5", "--gpu-memory-gb", "24", "--gpus-per-node", "2"],
     "needs 2 GPU(s) -> PP=2 (PCIe: communicate once per stage)"),
    ("405B FP8, 2 nodes x 8 x 80 GB", ["--weights-gb", "405", "--gpu-memory-gb", "80", "--nodes", "2", "--nvlink"],
     "needs 9 GPU(s) -> TP=8 inside a node, PP=2 across nodes"),
    ("MoE 235B FP8, 8 x 80 GB NVLink", ["--weights-gb", "235", "--gpu-memory-gb", "80", "--nvlink", "--moe"],
     "needs 5 GPU(s) -> TP=8, expert parallel for the MoE layers"),
    ("405B FP8, 8 x 80 GB NVLink", ["--weights-gb", "405", "--gpu-memory-gb", "80", "--nvlink"],
     "does not fit: 9 GPUs needed, 8 present"),
]


@pytest.mark.parametrize(("label", "flags", "answer"), SEED_EXAMPLE_14)
def test_each_seed_line_comes_from_the_flags(label: str, flags: list[str], answer: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "choose", "--label", label, *flags]) == 0
    assert capsys.readouterr().out == f"{label:<32} {answer}\n"


def test_the_issue_command(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "choose", "--weights-gb", "141.2", "--gpu-memory-gb", "80", "--gpus-per-node", "8",
            "--nodes", "1", "--nvlink"]
    assert main(argv) == 0
    assert capsys.readouterr().out == "141.2 GB, 8 x 80 GB NVLink       needs 3 GPU(s) -> TP=4, 2 replicas (DP)\n"


def test_catalogue_model_and_gpu_pick_weights_memory_and_link(capsys: pytest.CaptureFixture[str]) -> None:
    # Qwen2.5-32B at 4.5 bits is 18.45 GB; RTX 4090s have no NVLink, so the split is pipeline stages
    assert main(["plan", "choose", "--model", "qwen2.5-32b", "--bits", "4.5", "--gpu", "rtx4090",
                 "--gpus-per-node", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["deployment"]["nvlink"] is False
    assert doc["choice"]["summary"] == "needs 2 GPU(s) -> PP=2 (PCIe: communicate once per stage)"


def test_missing_weights_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "choose", "--gpu-memory-gb", "80"]) == 2
    assert "--weights-gb" in capsys.readouterr().err


def test_unknown_gpu_lists_the_valid_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "choose", "--weights-gb", "10", "--gpu", "v100"]) == 2
    assert "h100" in capsys.readouterr().err


def test_help_explains_the_kv_reserve(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "choose", "--help"])
    assert "kept for the KV cache" in capsys.readouterr().out


def test_default_label_rounds_weights_like_plan_fit(capsys: pytest.CaptureFixture[str]) -> None:
    # 32.8e9 x 4.5 / 8 = 18.45 GB: printed half-up as 18.5, the figure `plan fit` shows
    assert main(["plan", "choose", "--model", "qwen2.5-32b", "--bits", "4.5", "--gpu", "rtx4090",
                 "--gpus-per-node", "2"]) == 0
    assert capsys.readouterr().out.startswith("18.5 GB, 2 x 24 GB PCIe          needs 2 GPU(s)")
    assert main(["plan", "choose", "--weights-gb", "405", "--gpu", "h100", "--nodes", "2"]) == 0
    assert capsys.readouterr().out.startswith("405 GB, 2 nodes x 8 x 80 GB NVLink needs 9 GPU(s)")
