"""`fake-vllm serve` flags map onto VllmServeConfig as `vllm serve` spells them."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from fake_engines.vllm.cli import build_parser, config_from_args
from tests.conftest import REPO


def _config(*argv: str):
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_vllm_flags_and_short_forms():
    config = _config("llama-3.1-70b", "-tp", "4", "-pp", "2", "-dp", "2", "--max-num-seqs", "64",
                     "--no-enable-prefix-caching", "--enable-lora", "--lora-modules", "a=/x", "b=/y",
                     "--served-model-name", "big", "--num-gpu-blocks-override", "100")
    assert (config.tensor_parallel_size, config.pipeline_parallel_size, config.data_parallel_size) == (4, 2, 2)
    assert config.max_num_seqs == 64 and not config.enable_prefix_caching
    assert config.lora_modules == {"a": "/x", "b": "/y"} and config.model_name == "big"
    assert config.num_gpu_blocks_override == 100 and config.host == "127.0.0.1"


def test_explicit_shape_flags():
    config = _config("my-model", "--params", "8e9", "--layers", "32", "--kv-heads", "8", "--hidden", "4096")
    assert config.model_shape == {"params": 8e9, "layers": 32, "kv_heads": 8, "hidden": 4096}


def test_prefix_caching_hash_algo_flag_reaches_the_scheduler_and_cache_config_info():
    from fake_engines.vllm.engine import build_scheduler, cache_config_labels, size_engine

    assert _config("llama-3.1-8b").prefix_caching_hash_algo == "sha256"
    config = _config("llama-3.1-8b", "--prefix-caching-hash-algo", "builtin")
    spec = size_engine(config)
    assert build_scheduler(config, spec).kv_cache_manager._hash_chain.__name__ == "_builtin_chain"
    assert cache_config_labels(config, spec)["prefix_caching_hash_algo"] == "builtin"


def _fails(*argv: str) -> str:
    """stderr of a fake-vllm that must refuse to start: exit status 2, one line, no traceback."""
    out = subprocess.run([sys.executable, "-m", "fake_engines.vllm.cli", *argv], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


def test_a_port_in_use_is_one_line_naming_port_and_host():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = _fails("serve", "llama-3.2-1b", "--port", str(port))
    assert err == f"ERROR: port {port} on 127.0.0.1 is in use\n"


@pytest.mark.parametrize("argv,cause", [
    (["--host", "192.0.2.1", "--port", "0"], "ERROR: cannot listen on 192.0.2.1: not an address of this machine (--host)"),
    (["--port", "65536"], "fake-vllm serve: error: argument --port: invalid port 65536: must be in [0, 65535]"),
    (["--gpu", "tpu", "--port", "0"], "ERROR: unknown GPU 'tpu'; valid names: "),
    (["--time-scale", "x"], "fake-vllm serve: error: argument --time-scale: invalid float value: 'x'"),
])
def test_a_bad_flag_is_one_line_naming_it_and_exit_status_2(argv, cause):
    assert _fails("serve", "llama-3.2-1b", *argv).startswith(cause)
