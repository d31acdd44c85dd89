"""llama-server's checks of chat `messages` (build 0c1e570): the malformed requests of llama.cpp's own
test_invalid_chat_completion_req and the continue_final_message rules, unit and over a socket."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from fake_engines.llamacpp.chat_checks import check_chat_body
from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.errors import LlamaError
from fake_engines.llamacpp.server import start_llama
from tests.fake_engines.engine_thread import EngineThread

NON_ASSISTANT_WITHOUT_CONTENT = "All non-assistant messages must contain 'content'"


@pytest.mark.parametrize(("messages", "message"), [
    ([123], NON_ASSISTANT_WITHOUT_CONTENT),
    ([{}], NON_ASSISTANT_WITHOUT_CONTENT),
    ([{"role": 123}], NON_ASSISTANT_WITHOUT_CONTENT),
    ([{"role": "system", "content": 123}], "Expected 'content' to be a string or an array"),
    ([{"role": "system", "content": "test"}, {}], NON_ASSISTANT_WITHOUT_CONTENT),
    ([{"role": "user", "content": "test"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
     "Cannot have 2 or more assistant messages at the end of the list."),
    ([{"role": "assistant"}], "Assistant message must contain either 'content' or 'tool_calls'!"),
    ([{"content": "hi"}], "Missing 'role' in message: {\"content\":\"hi\"}"),
    ([{"role": "user", "content": [{"text": "x"}]}], "Missing content part type: {\"text\":\"x\"}"),
])
def test_malformed_messages_are_rejected_with_llama_servers_message(messages, message):
    with pytest.raises(LlamaError) as caught:
        check_chat_body({"messages": messages})
    assert (caught.value.status, caught.value.err_type, caught.value.message) == (400, "invalid_request_error", message)


def test_continue_final_message_needs_add_generation_prompt_off():
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Wh"}]
    with pytest.raises(LlamaError, match="Cannot set both add_generation_prompt and continue_final_message"):
        check_chat_body({"messages": messages, "continue_final_message": True})
    check_chat_body({"messages": messages, "continue_final_message": True, "add_generation_prompt": False})
    check_chat_body({"messages": messages})  # a trailing assistant message is prefilled, not an error


def test_well_formed_messages_pass():
    check_chat_body({"messages": [{"role": "system", "content": None}, {"role": "user", "content": [
        {"type": "text", "text": "hi"}]}, {"role": "assistant", "tool_calls": []}, {"role": "tool", "content": "x"}]})


def test_the_server_answers_400_with_the_envelope_for_malformed_messages():
    config = LlamaServerConfig(model="llama-3.1-8b-Q4_K_M.gguf", port=0, time_scale=0.01)
    with EngineThread(lambda: start_llama(config, cold_start=False)) as engine:
        req = urllib.request.Request(engine.base_url + "/v1/chat/completions",
                                     data=json.dumps({"messages": [{"role": 123}]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(req, timeout=30)
        assert caught.value.code == 400
        assert json.loads(caught.value.read()) == {"error": {
            "code": 400, "message": NON_ASSISTANT_WITHOUT_CONTENT, "type": "invalid_request_error"}}
