from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flotilla.cli import main
from tests.conftest import REPO

SEED_EXAMPLE_1 = """\
model  bits  weights GB  KV GB  total GB  GPUs  read ms, 1 GPU  read ms, split
8B     16.0        16.1   34.4      50.4     1            4.8             4.8
8B      8.0         8.0   34.4      42.4     1            2.4             2.4
8B      4.5         4.5   34.4      38.9     1            1.3             1.3
70B    16.0       141.2   85.9     227.1     4           42.1            10.5
70B     8.0        70.6   85.9     156.5     3           21.1             7.0
70B     4.5        39.7   85.9     125.6     2           11.9             5.9
405B   16.0       810.0  135.3     945.3    14          241.8            17.3
405B    8.0       405.0  135.3     540.3     8          120.9            15.1
405B    4.5       227.8  135.3     363.1     6           68.0            11.3
KV cache per token, 8B: 128 KiB
KV cache per token, 70B: 320 KiB
KV cache per token, 405B: 504 KiB
"""


def test_without_a_model_prints_the_lessons_table(capsys):
    assert main(["plan", "fit"]) == 0
    assert capsys.readouterr().out == SEED_EXAMPLE_1


def test_issue_command_prints_the_70b_line(capsys):
    assert main(["plan", "fit", "--model", "llama-3.1-70b", "--bits", "16", "--users", "32", "--context", "8192"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["llama-3.1-70b", "16.0", "141.2", "85.9", "227.1", "4", "42.1", "10.5"]
    assert lines[2] == "KV cache per token, llama-3.1-70b: 320 KiB"


def test_explicit_shape_and_gpu_figures_give_the_same_line(capsys):
    argv = ["plan", "fit", "--params", "70.6e9", "--layers", "80", "--kv-heads", "8", "--head-dim", "128",
            "--gpu-memory-gb", "80", "--usable", "0.9", "--bandwidth-tbs", "3.35", "--bits", "16"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[1:] == ["16.0", "141.2", "85.9", "227.1", "4", "42.1", "10.5"]


def test_named_gpu_changes_the_gpu_count(capsys):
    assert main(["plan", "fit", "--model", "llama-3.1-70b", "--bits", "16", "--gpu", "h200", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["gpus"] == 2  # 227.1 GB over 126.9 GB usable per H200
    assert row["read_1gpu_s"] == pytest.approx(141.2e9 / 4.8e12)


def test_without_bits_prints_the_three_precisions(capsys):
    assert main(["plan", "fit", "--model", "llama-3.1-8b"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:4]
    assert [r.split()[1] for r in rows] == ["16.0", "8.0", "4.5"]


def test_unknown_model_and_half_shape_are_one_line_errors(capsys):
    assert main(["plan", "fit", "--model", "llama-9b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flotilla plan fit: error: unknown model 'llama-9b'") and "llama-3.1-8b" in err
    assert main(["plan", "fit", "--params", "7e9"]) == 2
    assert "--layers and --kv-heads" in capsys.readouterr().err


def test_user_catalogue_adds_a_model(tmp_path, capsys):
    extra = tmp_path / "models.yaml"
    extra.write_text("models:\n  - {name: my-13b, params: 13e9, active_params: 13e9, layers: 40, kv_heads: 40, "
                     "head_dim: 128}\n")
    assert main(["plan", "fit", "--model", "my-13b", "--bits", "16", "--catalogue", str(extra)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["my-13b", "16.0", "26.0"]


def test_runs_as_a_real_subprocess():
    cmd = [sys.executable, "-m", "flotilla", "plan", "fit", "--model", "llama-3.1-70b", "--bits", "16",
           "--users", "32", "--context", "8192"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "141.2" in done.stdout and "227.1" in done.stdout and "10.5" in done.stdout


@pytest.mark.parametrize("topic", ["fit", "tp-demo", "allreduce", "pipeline", "experts", "step"])
def test_each_topic_help_explains_its_flags(topic, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", topic, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and "examples:" in out


def test_plan_help_lists_the_topics(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    for topic in ("fit", "tp-demo", "allreduce", "pipeline", "experts", "step"):
        assert topic in out
