"""Recordings made of a look-alike as the capture run made them, compared with the real ones."""

from __future__ import annotations

import pytest

from bench.fidelity.harness import _llama, _vllm
from bench.fidelity.record import Scenario
from bench.fidelity.recordings import compare, recorded


@pytest.mark.parametrize(("engine", "start", "transcript", "timing"), [
    ("vllm", _vllm, "027_chat_stream_raw_socket_transcript.http", "028_chat_stream_chunk_timing.txt"),
    ("llama.cpp", _llama, "032_chat_stream_raw_socket_transcript.http", "033_chat_stream_chunk_timing.txt"),
])
async def test_a_raw_socket_stream_with_connection_close_is_answered_as_the_real_engine_answered_it(
        engine, start, transcript, timing):
    """Status, header names (llama-server: `Connection: close`, no `Keep-Alive`, as cpp-httplib
    answers a client that asks to close), each event's shape in order and the final chunk."""
    async with start() as base:
        ours = await Scenario(engine, base, 1.0).stream_chunks()
    assert compare("transcript", recorded(engine, transcript), ours["chat_stream_raw_socket_transcript.http"]) == ""
    assert compare("chunks", recorded(engine, timing), ours["chat_stream_chunk_timing.txt"]) == ""
    assert "Keep-Alive" not in ours["chat_stream_raw_socket_transcript.http"]
