from __future__ import annotations

import json

import pytest

from flotilla.cli import main

SEED_EXAMPLE_15 = """\
LoRA parameters per rank per layer: 81920
rank  8: 20,971,520 parameters, 41.9 MB in BF16 (0.26% of the base model)
rank 16: 41,943,040 parameters, 83.9 MB in BF16 (0.52% of the base model)
rank 64: 167,772,160 parameters, 335.5 MB in BF16 (2.09% of the base model)
GPU adapter buffers for --max-loras 4 --max-lora-rank 64: 1.34 GB
20 fine-tuned variants: 321.2 GB as merged models, 17.7 GB as one base plus rank-16 adapters
"""
FLAGS = ["--ranks", "8,16,64", "--max-loras", "4", "--max-lora-rank", "64", "--tenants", "20"]


def test_the_issue_command_prints_seed_example_15(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "lora", "--model", "llama-3.1-8b", *FLAGS]) == 0
    assert capsys.readouterr().out == SEED_EXAMPLE_15


def test_explicit_shape_flags_give_the_same_figures(capsys: pytest.CaptureFixture[str]) -> None:
    shape = ["--params", "8.03e9", "--layers", "32", "--hidden", "4096", "--intermediate", "14336",
             "--kv-heads", "8", "--head-dim", "128"]
    assert main(["plan", "lora", *shape, *FLAGS]) == 0
    assert capsys.readouterr().out == SEED_EXAMPLE_15


def test_attention_only_targets_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "lora", "--model", "llama-3.1-8b", "--target-modules", "q_proj,v_proj",
                 "--ranks", "16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["params_per_rank_per_layer"] == 4096 + 4096 + 4096 + 1024
    assert doc["adapters"][0]["params"] == 16 * 13312 * 32
    assert doc["vllm_buffer_bytes"] == 1 * 16 * 13312 * 32 * 2  # vLLM defaults: 1 slot at rank 16
    assert "tenants" not in doc


def test_incomplete_shape_names_the_missing_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "lora", "--layers", "32", "--hidden", "4096"]) == 2
    assert "--params --intermediate --kv-heads" in capsys.readouterr().err


def test_unknown_target_module_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "lora", "--model", "llama-3.1-8b", "--target-modules", "qkv_proj"]) == 2
    assert "unknown modules ['qkv_proj']" in capsys.readouterr().err


def test_help_explains_the_vllm_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "lora", "--help"])
    out = capsys.readouterr().out
    assert "--max-loras" in out and "rank every slot is sized for" in out


def test_tensor_parallel_line_gives_each_gpus_share(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "lora", "--model", "llama-3.1-70b", "--ranks", "16", "--max-loras", "4",
                 "--max-lora-rank", "64", "-tp", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "GPU adapter buffers for --max-loras 4 --max-lora-rank 64: 6.63 GB"
    assert lines[3] == "  each of the 4 GPUs of -tp 4 holds 3.42 GB of them"


@pytest.mark.parametrize(("flags", "message"), [(["--ranks", "0"], "rank must be >= 1"),
                                                (["--tenants", "-2"], "tenants must be >= 0")])
def test_nonsense_counts_are_errors_not_tracebacks(flags: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "lora", "--model", "llama-3.1-8b", *flags]) == 2
    assert message in capsys.readouterr().err


def test_gpu_adds_the_adapter_step_cost_the_lookalike_vllm_pays(capsys: pytest.CaptureFixture[str]) -> None:
    from fake_engines.factory import build_engine, parse_command
    from fake_engines.perf.batch import StepBatch

    assert main(["plan", "lora", "--model", "llama-3.1-8b", "--max-loras", "4", "--max-lora-rank", "16",
                 "--gpu", "h100", "--batch", "32", "--context", "2048", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)["step_cost"]
    assert cost["adapter_bytes_per_gpu"] == 16 * 81920 * 32 * 2  # 83.9 MB: the rank-16 adapter of Example 15
    assert cost["adapter_flops_per_gpu"] == 2 * 32 * 16 * 81920 * 32  # 2 r (in + out) per token and module
    engine = build_engine(parse_command(["fake-vllm", "serve", "llama-3.1-8b", "--enable-lora", "--max-loras", "4"]))
    assert cost["step_s"] == [engine.step_time(StepBatch(decode_seqs=32, decode_context_tokens=32 * 2048,
                                                         lora_adapters=k)) for k in range(5)]
    assert cost["step_s"] == sorted(cost["step_s"]) and len(set(cost["step_s"])) == 5
    assert main(["plan", "lora", "--model", "llama-3.1-8b", "--max-loras", "2", "--gpu", "h100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4].startswith("decode step of 32 sequences x 2048 tokens on h100: ")
    assert lines[-2].startswith("  2 distinct adapters: ") and "each adapter: 83.9 MB read per GPU" in lines[-1]
