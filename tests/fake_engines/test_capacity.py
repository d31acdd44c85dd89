"""Modelled capacity of a look-alike engine, read from the command line that starts it."""

from __future__ import annotations

import sys

import pytest

from fake_engines.capacity import capacity_rps, engine_config
from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.vllm.config import VllmServeConfig

VLLM = [sys.executable, "-m", "fake_engines.vllm.cli", "serve", "llama-3.1-8b", "--gpu", "h100"]
LLAMA = [sys.executable, "-m", "fake_engines.llamacpp.cli", "-m", "llama-3.1-8b-Q4_K_M.gguf", "--gpu", "rtx4090",
         "-c", "32768", "-ngl", "99", "-np", "4"]


def test_the_command_line_is_read_by_the_engines_own_parser() -> None:
    vllm, llama = engine_config(VLLM + ["-tp", "2"]), engine_config(LLAMA)
    assert isinstance(vllm, VllmServeConfig) and (vllm.gpu, vllm.tensor_parallel_size) == ("h100", 2)
    assert isinstance(llama, LlamaServerConfig) and (llama.gpu, llama.n_parallel) == ("rtx4090", 4)


def test_an_h100_vllm_replica_does_many_times_what_an_rtx4090_llama_server_does() -> None:
    h100, rtx4090 = capacity_rps(engine_config(VLLM)), capacity_rps(engine_config(LLAMA))
    assert 10 < h100 / rtx4090 < 30  # hundreds of running sequences against four slots
    # at a batch of one they are alike: the figure is what each sustains when full
    assert capacity_rps(engine_config(VLLM + ["--max-num-seqs", "1"])) < 2 * rtx4090 / 4


def test_more_slots_or_data_parallel_engines_do_more() -> None:
    assert capacity_rps(engine_config(LLAMA[:-1] + ["8"])) > capacity_rps(engine_config(LLAMA))
    one, two = capacity_rps(engine_config(VLLM)), capacity_rps(engine_config(VLLM + ["-dp", "2"]))
    assert two == pytest.approx(2 * one)


def test_a_command_that_starts_no_look_alike_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="not a look-alike engine"):
        engine_config(["vllm", "serve", "llama-3.1-8b"])
