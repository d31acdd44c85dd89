import os
import subprocess
import sys
from pathlib import Path

from bench.llamacpp_suite.wrapper import CATALOGUE_MODEL, map_model_args, map_template_file

REPO = Path(__file__).resolve().parents[3]


def nothing_exists(_: str) -> bool:
    return False


def test_hf_repo_and_file_become_one_catalogue_model_and_other_flags_pass_through():
    argv = ["--port", "8080", "--temp", "0.8", "--hf-repo", "ggml-org/models", "--hf-file", "x/y.gguf",
            "--embedding", "--no-jinja"]
    assert map_model_args(argv, nothing_exists) == [
        "--port", "8080", "--temp", "0.8", "--embedding", "--no-jinja", "-m", CATALOGUE_MODEL]


def test_missing_model_file_is_replaced_and_an_existing_one_kept(tmp_path):
    assert map_model_args(["-m", "models/absent/a.gguf", "-c", "512"], nothing_exists) == [
        "-c", "512", "-m", CATALOGUE_MODEL]
    real = tmp_path / "m.gguf"
    real.write_bytes(b"GGUF")
    assert map_model_args(["--hf-repo", "r", "--model", str(real)]) == ["--model", str(real)]


def test_a_template_file_named_by_its_place_in_llama_cpp_s_tree_is_read_from_the_sdist_s_copy(tmp_path):
    upstream = "../../../models/templates/Qwen-QwQ-32B.jinja"  # an input, not a path read
    argv = ["--jinja", "--chat-template-file", upstream, "--port", "1"]
    assert map_template_file(argv, str(tmp_path), nothing_exists) == [
        "--jinja", "--chat-template-file", str(tmp_path / "Qwen-QwQ-32B.jinja"), "--port", "1"]
    own = ["--chat-template-file", "mine.jinja"]
    assert map_template_file(own, str(tmp_path), nothing_exists) == own  # not under models/templates: as given


def test_a_command_line_without_any_model_stays_without_one():
    # router mode (no -m, --models-dir) is a difference to measure, not to paper over
    argv = ["--port", "8080", "--models-dir", "/tmp/presets", "--no-models-autoload"]
    assert map_model_args(argv, nothing_exists) == argv


def test_wrapper_starts_the_look_alike_with_mapped_flags():
    # --print-config resolves the config and exits: proves the catalogue model and passed flags are accepted
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "bench.llamacpp_suite.wrapper", "--hf-repo",
                          "ggml-org/test-model-stories260K", "--temp", "0.8", "--no-jinja", "-c", "512",
                          "--print-config"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "llama-3.2-1b" in out.stdout


def test_a_download_is_named_as_the_cache_lists_it_and_a_router_then_sees_it(tmp_path, monkeypatch):
    from bench.llamacpp_suite.wrapper import downloaded
    from fake_engines.llamacpp.model_sources import cached_models, record_download

    assert downloaded(["--hf-repo", "ggml-org/tinygemma3-GGUF:Q8_0"]) == \
        ("ggml-org/tinygemma3-GGUF:Q8_0", "ggml-org/tinygemma3-GGUF")
    assert downloaded(["-hf", "ggml-org/test-model-stories260K"])[0] == "ggml-org/test-model-stories260K:F32"
    assert downloaded(["--hf-repo", "ggml-org/models", "--hf-file", "tinyllamas/stories260K.gguf"]) is None
    assert downloaded(["--port", "8080"]) is None
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path))
    record_download("ggml-org/tinygemma3-GGUF:Q8_0", "ggml-org/tinygemma3-GGUF")
    assert [(m.name, m.source) for m in cached_models()] == [("ggml-org/tinygemma3-GGUF:Q8_0", "cache")]
