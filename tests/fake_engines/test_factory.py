"""The engine factory: flags -> resolved config -> sized core, one path for every engine user."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fake_engines.factory import (
    EngineFlagError,
    LlamaServerConfig,
    VllmServeConfig,
    build_engine,
    engine_command,
    option_flags,
    parse_command,
    parse_flags,
)
from tests.conftest import REPO


def _print_config(argv: list[str]) -> dict:
    out = subprocess.run([*argv, "--print-config"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_fake_vllm_print_config_is_the_factorys_description_with_vllms_h100_defaults() -> None:
    argv = engine_command("vllm", ["serve", "llama-3.1-8b", "--gpu", "h100"])
    printed = _print_config(argv)
    assert printed == build_engine(parse_command(argv)).describe()
    assert (printed["max_num_seqs"], printed["max_num_batched_tokens"], printed["max_model_len"]) == (1024, 8192, 131072)
    assert "port" not in printed and "host" not in printed and "api_key" not in printed


def test_fake_llama_server_print_config_is_the_factorys_description() -> None:
    argv = engine_command("llamacpp", ["-m", "llama-3.1-8b-Q4_K_M.gguf", "--gpu", "rtx4090", "-np", "2", "-c", "8192"])
    printed = _print_config(argv)
    assert printed == build_engine(parse_command(argv)).describe()
    assert (printed["num_slots"], printed["slot_n_ctx"], printed["n_ctx_train"]) == (2, 4096, 131072)


def test_print_config_of_a_model_that_does_not_fit_fails_as_the_start_would() -> None:
    out = subprocess.run([*engine_command("vllm", ["serve", "llama-3.1-8b", "--gpu", "rtx4090"]), "--print-config"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "max seq len (131072)" in out.stderr and not out.stdout


def test_commands_are_read_by_the_engines_own_parser_whatever_names_the_program() -> None:
    by_module = parse_command([sys.executable, "-m", "fake_engines.vllm.cli", "serve", "llama-3.2-1b", "-tp", "2"])
    by_program = parse_command(["/usr/bin/fake-vllm", "serve", "llama-3.2-1b", "-tp", "2"])
    assert by_module == by_program == parse_flags("vllm", ["serve", "llama-3.2-1b", "-tp", "2"])
    assert isinstance(by_module, VllmServeConfig) and by_module.tensor_parallel_size == 2
    assert isinstance(parse_command(["fake-llama-server", "-m", "x-Q8_0.gguf"]), LlamaServerConfig)
    with pytest.raises(ValueError, match="not a look-alike engine command"):
        parse_command(["vllm", "serve", "x"])


def test_a_bad_flag_is_an_error_not_an_exit() -> None:
    with pytest.raises(EngineFlagError, match="--max-num-seqs"):
        parse_flags("vllm", ["serve", "llama-3.1-8b", "--max-num-seqs", "many"])
    with pytest.raises(EngineFlagError, match="unrecognized arguments: --colour"):
        parse_flags("llamacpp", ["-m", "x-Q8_0.gguf", "--colour", "red"])


@pytest.mark.parametrize(("flavor", "base", "options"), [
    ("vllm", ["serve", "llama-3.1-8b"], {"max_num_seqs": 64, "enable_prefix_caching": False, "block_size": 8,
                                         "enable_lora": True, "lora_modules": {"a": "/a"}, "startup_s": 2.5,
                                         "enable_prompt_tokens_details": True, "mean_output_tokens": 32.0,
                                         "max_model_len": 4096}),
    ("llamacpp", ["-m", "llama-3.1-8b-Q4_K_M.gguf"], {"n_parallel": 2, "n_ctx": 8192, "tensor_split": [3.0, 1.0],
                                                      "warmup": False, "metrics": True, "slots": False,
                                                      "loras": [("/l.gguf", 0.5)], "startup_s": 0.0}),
])
def test_config_fields_given_in_python_become_the_flags_that_set_them(flavor: str, base: list[str],
                                                                      options: dict) -> None:
    config = parse_flags(flavor, [*base, *option_flags(flavor, options)])
    assert {name: getattr(config, name) for name in options} == options


def test_an_unknown_config_field_is_refused_by_name() -> None:
    with pytest.raises(EngineFlagError, match=r"n_parallel: not a VllmServeConfig field; known: \["):
        option_flags("vllm", {"n_parallel": 2})


def test_a_built_vllm_engine_has_the_resolved_limits_in_config_and_core() -> None:
    engine = build_engine(parse_flags("vllm", ["serve", "llama-3.1-8b", "--gpu", "a100", "--max-model-len", "auto"]))
    assert isinstance(engine.config, VllmServeConfig)
    assert (engine.config.max_num_seqs, engine.config.max_num_batched_tokens, engine.config.max_model_len) == (
        256, 2048, 131072)
    core = engine.new_core()
    assert core.config.max_model_len == 131072 and core.config.num_gpu_blocks == engine.spec.num_gpu_blocks
    assert engine.new_core() is not core  # one per data-parallel rank, or per simulated run
