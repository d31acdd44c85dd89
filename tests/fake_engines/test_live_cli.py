"""Both look-alike CLIs as real subprocesses: start, serve, pass promtool, exit cleanly on SIGTERM."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import REPO

ALLOWED_LINT = {
    "vllm": {'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix'},
    "llama": {'llamacpp:n_tokens_max counter metrics should have "_total" suffix'},
}
"""promtool findings the real engines get too (beyond 'metric names should not contain ":"')."""


def _spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _wait_for_line(proc: subprocess.Popen, pattern: str) -> re.Match:
    for line in proc.stdout:
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"process exited (rc={proc.wait()}) before printing {pattern!r}")


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.read().decode()


def _complete(base: str) -> dict:
    body = json.dumps({"prompt": "Hello world, the quick brown fox", "max_tokens": 8}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _promtool_findings(text: str) -> set[str]:
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode in (0, 3), result.stderr  # 1 would be a parse error
    lines = {line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()}
    return {line for line in lines if "should not contain ':'" not in line}


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    finally:
        proc.kill() if proc.poll() is None else None


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
@pytest.mark.parametrize("kind", ["vllm", "llama"])
def test_cli_serves_passes_promtool_and_exits_on_sigterm(kind):
    if kind == "vllm":
        proc = _spawn(["fake_engines.vllm.cli", "serve", "llama-3.1-8b", "--port", "0", "--time-scale", "0.01",
                       "--startup-seconds", "1", "--warmup-seconds", "1"])
        port = _wait_for_line(proc, r"Uvicorn running on http://127\.0\.0\.1:(\d+)").group(1)
    else:
        proc = _spawn(["fake_engines.llamacpp.cli", "-m", "llama-3.1-8b-Q4_K_M.gguf", "--port", "0", "--metrics",
                       "--time-scale", "0.01", "-np", "2"])
        port = _wait_for_line(proc, r"listening on http://127\.0\.0\.1:(\d+)").group(1)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if _get(base + "/health")[0] == 200:
                    break
            except OSError:
                pass
        assert _complete(base)["usage"]["completion_tokens"] >= 1
        findings = _promtool_findings(_get(base + "/metrics")[1])
    finally:
        rc = _stop(proc)
    assert findings <= ALLOWED_LINT[kind]
    assert rc == 0


def test_vllm_cli_refuses_a_model_that_does_not_fit():
    proc = subprocess.run([sys.executable, "-m", "fake_engines.vllm.cli", "serve", "llama-3.1-70b", "--gpu", "h100",
                           "--port", "0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory" in proc.stderr


REAL_COMMAND_LINES = {
    "vllm": (["fake_engines.vllm.cli", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--trust-remote-code",
              "--enforce-eager", "--kv-cache-dtype", "fp8", "--disable-log-stats", "--no-enable-log-requests",
              "--download-dir", "/tmp/hf", "--max-model-len", "8192", "--gpu-memory-utilization", "0.92",
              "--port", "0", "--time-scale", "0.01", "--startup-seconds", "1", "--warmup-seconds", "1"],
             r"Uvicorn running on http://127\.0\.0\.1:(\d+)", "meta-llama/Llama-3.1-8B-Instruct"),
    "llama": (["fake_engines.llamacpp.cli", "-m", "/models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "-fa", "on",
               "-ctk", "q8_0", "-ctv", "q8_0", "-t", "8", "--jinja", "-cb", "-ngl", "99", "--port", "0",
               "--time-scale", "0.01"],
              r"listening on http://127\.0\.0\.1:(\d+)", "/models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"),
}
"""Command lines as real deployments write them: a Hugging Face id or file name, flags the
look-alike models (--kv-cache-dtype, -ctk) and flags it only accepts (--trust-remote-code, -t)."""


@pytest.mark.parametrize("kind", ["vllm", "llama"])
def test_real_command_lines_start_serve_and_list_the_model_as_given(kind):
    argv, ready, model_id = REAL_COMMAND_LINES[kind]
    proc = _spawn(argv)
    base = f"http://127.0.0.1:{_wait_for_line(proc, ready).group(1)}"
    try:
        for _ in range(200):
            try:
                if _get(base + "/health")[0] == 200:
                    break
            except OSError:
                pass
        models = json.loads(_get(base + "/v1/models")[1])
        completion = _complete(base)
    finally:
        rc = _stop(proc)
    assert [entry["id"] for entry in models["data"]] == [model_id]
    assert completion["model"] == model_id and completion["usage"]["completion_tokens"] >= 1
    assert rc == 0
