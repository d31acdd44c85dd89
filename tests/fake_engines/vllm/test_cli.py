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


def test_hugging_face_id_and_common_vllm_flags_are_accepted():
    config = _config("meta-llama/Llama-3.1-8B-Instruct", "--trust-remote-code", "--enforce-eager",
                     "--kv-cache-dtype", "fp8", "--download-dir", "/tmp/hf", "-q", "fp8", "--tool-call-parser", "hermes",
                     "--enable-auto-tool-choice", "--disable-log-stats", "--no-enable-log-requests", "-O3",
                     "--max-cpu-loras", "4", "--no-enable-lora", "--uvicorn-log-level", "warning")
    assert config.model == "meta-llama/Llama-3.1-8B-Instruct" and config.model_name == config.model
    assert config.kv_cache_dtype == "fp8" and config.enforce_eager and not config.enable_lora


def test_every_vllm_0_32_flag_is_accepted_and_every_flag_has_help():
    from fake_engines.vllm.upstream_flags import FLAGS

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    for spellings, arity, choices, _help in FLAGS:
        if spellings[0] in ("--model", "--kv-events-config", "--kv-transfer-config", "--lora-modules", "--port") or arity == "optional":
            continue  # MODEL is positional; the look-alike's own flags are tested on their own
        value = [] if arity == "flag" else [choices[0] if choices else "1"]
        serve.parse_args(["llama-3.2-1b", spellings[-1], *value])
    helpless = [a.option_strings for a in serve._actions if a.option_strings and not a.help]
    assert helpless == []


def test_kv_cache_dtype_fp8_holds_twice_the_tokens_and_reads_half_the_kv_bytes():
    from fake_engines.factory import build_engine
    from fake_engines.perf.step_time import decode_batch

    bf16 = build_engine(_config("llama-3.1-8b"))
    fp8 = build_engine(_config("llama-3.1-8b", "--kv-cache-dtype", "fp8"))
    # 16-token blocks of 32 layers x 8 KV heads x 128 x K,V: 2 MiB at 2 bytes, 1 MiB at 1 byte
    assert fp8.spec.kv_cache_memory_bytes == pytest.approx(bf16.spec.kv_cache_memory_bytes, abs=2**20)
    assert fp8.spec.num_gpu_blocks in (2 * bf16.spec.num_gpu_blocks, 2 * bf16.spec.num_gpu_blocks + 1)
    long_decode = decode_batch(64, 4000)
    assert fp8.step_time(long_decode) < bf16.step_time(long_decode)
    from fake_engines.vllm.engine import cache_config_labels

    assert cache_config_labels(fp8.config, fp8.spec)["cache_dtype"] == "fp8"


def test_enforce_eager_makes_decode_steps_pay_their_kernel_launches():
    from fake_engines.factory import build_engine
    from fake_engines.perf.step_time import EAGER_LAUNCH_PER_LAYER_S, FIXED_OVERHEAD_S, decode_batch

    graphs = build_engine(_config("llama-3.1-8b"))
    eager = build_engine(_config("llama-3.1-8b", "--enforce-eager"))
    small = decode_batch(1, 100)
    assert graphs.step_time(small) < eager.step_time(small)
    assert eager.step_time(small) == pytest.approx(FIXED_OVERHEAD_S + EAGER_LAUNCH_PER_LAYER_S * 32)
    assert list(eager.decode_run_time(small, 1, 3)) == [eager.step_time(decode_batch(1, 100 + i)) for i in range(3)]


def test_cpu_offload_frees_gpu_memory_for_kv_and_costs_a_pcie_read_per_step():
    from fake_engines.factory import build_engine
    from fake_engines.perf.catalogue import load_catalogue
    from fake_engines.perf.step_time import decode_batch

    base = build_engine(_config("llama-3.1-8b"))
    offload = build_engine(_config("llama-3.1-8b", "--cpu-offload-gb", "4"))
    block_bytes = base.spec.kv_cache_memory_bytes / base.spec.num_gpu_blocks
    assert offload.spec.num_gpu_blocks - base.spec.num_gpu_blocks == pytest.approx(4 * 2**30 / block_bytes, abs=1)
    pcie = load_catalogue().link("pcie4").bytes_s
    batch = decode_batch(8, 1000)
    assert offload.step_time(batch) - base.step_time(batch) == pytest.approx(4 * 2**30 / pcie)


def test_version_prints_the_imitated_vllm_release():
    out = subprocess.run([sys.executable, "-m", "fake_engines.vllm.cli", "--version"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "0.32.0\n")


def test_unknown_hugging_face_id_says_which_are_known_and_how_to_add_one():
    err = _fails("serve", "meta-llama/Llama-3.1-9B-Instruct", "--port", "0")
    assert err.startswith("ERROR: model 'meta-llama/Llama-3.1-9B-Instruct' is not in the catalogue")
    assert "llama-3.1-8b" in err and "--catalogue FILE" in err


def test_async_scheduling_flags_as_vllm_spells_them_reach_the_scheduler():
    from fake_engines.vllm.engine import build_scheduler, size_engine

    for argv, expected in (((), False), (("--async-scheduling",), True), (("--no-async-scheduling",), False)):
        config = _config("llama-3.1-8b", *argv)
        core = build_scheduler(config, size_engine(config))
        assert core.async_scheduling is expected
        assert core.max_concurrent_batches == (2 if expected else 1)
    assert "-pp > 1 is not modelled" in _fails("serve", "llama-3.1-8b", "--async-scheduling", "-pp", "2")


def test_kv_transfer_config_takes_vllms_fields_and_refuses_what_vllm_refuses():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    args = serve.parse_args(["llama-3.2-1b", "--kv-transfer-config",
                             '{"kv_connector":"NixlConnector","kv_role":"kv_producer","engine_id":"p0",'
                             '"kv_connector_extra_config":{"kv_lease_duration":5}}'])
    config = args.kv_transfer_config
    assert (config.kv_role, config.engine_id, config.kv_lease_s, config.kv_port) == ("kv_producer", "p0", 5.0, 14579)
    assert config.is_kv_transfer_instance
    for bad in ('{"kv_connector":"NixlConnector"}', '{"kv_connector":"NixlConnector","kv_role":"kv_sender"}',
                '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}', '{"kv_rol":"kv_both"}', "[1]"):
        with pytest.raises(SystemExit):
            serve.parse_args(["llama-3.2-1b", "--kv-transfer-config", bad])
