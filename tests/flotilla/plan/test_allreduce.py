from __future__ import annotations

import json

import pytest

from flotilla.cli import main

SEED_EXAMPLE_5 = """\
forward pass          MB per all-reduce  MB sent per GPU  NVLink ms  PCIe 4.0 ms
decode, batch 1                   0.016              4.6       0.01         0.15
decode, batch 64                  1.049            293.6       0.65         9.32
prefill, 4096 tokens             67.109          18790.5      41.76       596.52
ring steps one after another per pass: 160 all-reduces x 14 steps = 2240
  at an assumed 1 us per step: 2.24 ms per pass
  at an assumed 5 us per step: 11.20 ms per pass
decode reference: reading 17.65 GB of weights per GPU at 3.35 TB/s takes 5.27 ms
prefill reference: 2 x 70.6e9 x 4096 FLOPs over 8 GPUs at 989 TFLOP/s takes 73.1 ms
"""


def test_issue_command_prints_example_5_in_full(capsys):
    argv = ["plan", "allreduce", "--hidden", "8192", "--layers", "80", "--tp", "8", "--tokens", "1,64,4096",
            "--params", "70.6e9"]
    assert main(argv) == 0
    assert capsys.readouterr().out == SEED_EXAMPLE_5


def test_model_name_and_other_links(capsys):
    assert main(["plan", "allreduce", "--model", "llama-3.1-8b", "--tp", "2", "--links", "nvlink,eth100",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sequential_steps"] == 64 * 2
    prefill = doc["passes"][2]
    assert prefill["bytes_per_gpu"] == pytest.approx(4096 * 4096 * 2 * 64)  # 2(n-1)/n = 1 for n = 2
    assert prefill["bandwidth_s"]["eth100"] == pytest.approx(prefill["bytes_per_gpu"] / 12.5e9)


def test_one_gpu_or_missing_shape_is_an_error(capsys):
    assert main(["plan", "allreduce", "--hidden", "8192", "--layers", "80", "--tp", "1"]) == 2
    assert "--tp must be at least 2" in capsys.readouterr().err
    assert main(["plan", "allreduce", "--tp", "8"]) == 2
    assert "--hidden and --layers" in capsys.readouterr().err
