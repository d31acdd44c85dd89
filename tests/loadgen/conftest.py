"""Fixtures serving the test SSE server in process or in its own process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.loadgen.sse_server import SseServerState, make_app


@pytest.fixture
async def sse_server(aiohttp_server):
    """(base_url, state) of a running in-process test server; set state.token_delay_s to slow it."""
    state = SseServerState()
    server = await aiohttp_server(make_app(state), host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}", state


@pytest.fixture
def slow_sse_server_process(repo_root):
    """Base URL of the test server in its own process, streaming one token per 0.5 s."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.loadgen.sse_server", "--token-delay-s", "0.5"],
                            cwd=repo_root, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
