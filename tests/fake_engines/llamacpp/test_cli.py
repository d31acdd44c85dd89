"""`fake-llama-server` flags map onto LlamaServerConfig as llama-server spells them."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from fake_engines.llamacpp.cli import build_parser, config_from_args, dashed_flags
from tests.conftest import REPO


def test_llama_server_flags_and_short_forms():
    args = build_parser().parse_args(["-m", "llama-3.1-8b-Q4_K_M.gguf", "-a", "m", "-c", "8192", "-np", "3", "-ngl",
                                      "20", "-sm", "row", "-ts", "3,1", "-mg", "1", "-b", "1024", "-ub", "256",
                                      "--lora", "a.gguf", "--lora-scaled", "b.gguf", "0.5", "--no-warmup", "--metrics",
                                      "--no-slots", "--slot-prompt-similarity", "0.5"])
    config = config_from_args(args)
    assert (config.model_id, config.n_ctx, config.n_parallel, config.n_gpu_layers) == ("m", 8192, 3, 20)
    assert (config.split_mode, config.tensor_split, config.main_gpu, config.num_gpus) == ("row", [3.0, 1.0], 1, 2)
    assert (config.n_batch, config.n_ubatch) == (1024, 256)
    assert config.loras == [("a.gguf", 1.0), ("b.gguf", 0.5)]
    assert not config.warmup and config.metrics and not config.slots and config.slot_prompt_similarity == 0.5


def _fails(*argv: str) -> str:
    """stderr of a fake-llama-server that must refuse to start: exit status 2, one line, no traceback."""
    out = subprocess.run([sys.executable, "-m", "fake_engines.llamacpp.cli", *argv], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


def test_a_port_in_use_is_one_line_naming_port_and_host():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = _fails("-m", "llama-3.2-1b-Q4_K_M.gguf", "--port", str(port))
    assert err == f"error: port {port} on 127.0.0.1 is in use\n"


@pytest.mark.parametrize("argv,cause", [
    (["--host", "192.0.2.1", "--port", "0"], "error: cannot listen on 192.0.2.1: not an address of this machine (--host)"),
    (["--port", "65536"], "fake-llama-server: error: argument --port: invalid port 65536: must be in [0, 65535]"),
    (["--gpu", "tpu", "--port", "0"], "error: unknown GPU 'tpu'; valid names: "),
    (["--time-scale", "x"], "fake-llama-server: error: argument --time-scale: invalid float value: 'x'"),
    (["--lora-scaled", "a.gguf", "x"], "error: --lora-scaled expects FNAME SCALE with a number for SCALE, got 'x'"),
    (["--port", "0", "-m", "/nowhere/model.gguf"], "error: failed to load model '/nowhere/model.gguf'"),
])
def test_a_bad_flag_is_one_line_naming_it_and_exit_status_2(argv, cause):
    assert _fails("-m", "llama-3.2-1b-Q4_K_M.gguf", *argv).startswith(cause)


def test_readme_command_line_is_not_read_as_c_tk():
    """`-ctk q8_0` is the K cache type, never `-c tk` (argparse's short-option clustering)."""
    config = config_from_args(build_parser().parse_args(["-m", "llama-3.1-8b-Q4_K_M.gguf", "-fa", "on", "-ctk", "q8_0",
                                                         "-ctv", "q8_0"]))
    assert (config.flash_attn, config.cache_type_k, config.cache_type_v, config.n_ctx) == ("on", "q8_0", "q8_0", 4096)
    assert config_from_args(build_parser().parse_args(["-m", "x-Q4_0.gguf", "-fa"])).flash_attn == "on"


def test_abbreviated_long_spellings_are_refused_as_llama_cpp_does():
    assert "unrecognized arguments: --ctx 8" in _fails("-m", "llama-3.2-1b-Q4_K_M.gguf", "--ctx", "8")


def test_q8_0_kv_cache_reads_about_half_the_kv_bytes():
    from fake_engines.factory import build_engine
    from fake_engines.perf.step_time import decode_batch

    f16 = build_engine(config_from_args(build_parser().parse_args(["-m", "llama-3.1-8b-Q4_K_M.gguf"])))
    q8 = build_engine(config_from_args(build_parser().parse_args(["-m", "llama-3.1-8b-Q4_K_M.gguf", "-ctk", "q8_0",
                                                                  "-ctv", "q8_0"])))
    assert (f16.spec.kv_bytes, q8.spec.kv_bytes) == (2.0, 34 / 32)  # ggml's q8_0: 32 int8 + an f16 scale
    assert q8.step_time(decode_batch(4, 8000)) < f16.step_time(decode_batch(4, 8000))


def test_every_llama_server_flag_is_accepted_and_every_flag_has_help():
    from fake_engines.llamacpp.upstream_flags import FLAGS

    parser = build_parser()
    own = {"-m", "--port", "-ts", "--lora-scaled", "-sm", "-ctk", "-ctv", "-fa", "--pooling"}
    for spellings, arity, _choices, _help in FLAGS:
        if own & set(spellings):
            continue  # the look-alike's own flags, with their own values, are tested above
        value = [] if arity == "flag" else ["1"]
        parser.parse_args(["-m", "x-Q4_0.gguf", spellings[0], *value])
    helpless = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    assert helpless == []


def test_version_prints_the_imitated_build_on_stderr():
    out = subprocess.run([sys.executable, "-m", "fake_engines.llamacpp.cli", "--version"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == ""
    assert out.stderr == "version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64\n"


def test_underscores_in_a_long_flag_read_as_dashes_as_llama_cpp_does():
    # llama.cpp's own server tests pass --backend_sampling
    argv = dashed_flags(["-m", "x_y-Q4_0.gguf", "--backend_sampling", "--cache_type_k", "q8_0", "--alias", "a_b"])
    assert argv == ["-m", "x_y-Q4_0.gguf", "--backend-sampling", "--cache-type-k", "q8_0", "--alias", "a_b"]
    args = build_parser().parse_args(argv)
    assert args.cache_type_k == "q8_0" and args.alias == "a_b" and args.model == "x_y-Q4_0.gguf"
    out = subprocess.run([sys.executable, "-m", "fake_engines.llamacpp.cli", "-m", "llama-3.2-1b-Q8_0.gguf",
                          "--backend_sampling", "--print-config"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
