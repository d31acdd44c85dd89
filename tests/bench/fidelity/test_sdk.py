"""The openai SDK's view of a capture: what a client sees is what is compared."""

from __future__ import annotations

from bench.fidelity.sdk import captured_objects, sdk_shape


def test_the_sdk_shape_of_a_capture_sees_the_engines_own_fields_and_counts_a_run_of_chunks_once():
    vllm = captured_objects("vllm", "017_chat_nonstream", "chat.completions.create")
    llama = captured_objects("llama.cpp", "020_chat_nonstream", "chat.completions.create")
    assert len(vllm) == len(llama) == 1 and sdk_shape(vllm) != sdk_shape(llama)
    chunks = captured_objects("vllm", "019_chat_stream_no_stream_options", "chat.completions.create")
    assert len(chunks) > len(sdk_shape(chunks)) >= 2
    assert sdk_shape(chunks + chunks[-1:]) == sdk_shape(chunks)
