"""Chat templates rendered as llama-server renders them (fake_engines/llamacpp/templates.py and
builtin_templates.py). Expected prompts are written out from the template sources (llama.cpp's
src/llama-chat.cpp for the built-in formats, the quoted Jinja for the rest), not from our output."""

from __future__ import annotations

import datetime
import json

import aiohttp
import pytest

from fake_engines.factory.llamacpp_config import build_parser, config_from_args
from fake_engines.llamacpp import builtin_templates as builtin
from fake_engines.llamacpp.config import LlamaServerConfig, ServerConfigError
from fake_engines.llamacpp.errors import LlamaError
from fake_engines.llamacpp.server import start_llama
from fake_engines.llamacpp.templates import (
    ChatOptions,
    ChatTemplates,
    TemplateError,
    TemplateSettings,
    chat_options,
)
from tests.fake_engines.client import post_on

BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]

QWEN3_TAIL = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
              "'<|im_end|>\\n' }}{%- endfor %}\n"
              "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
              "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
              "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}\n")
"""The generation prompt of models/templates/Qwen-Qwen3-0.6B.jinja (its message loop shortened)."""

DEEPSEEK_R1_TAIL = ("{%- for message in messages %}{{'<｜User｜>' + message['content']}}{%- endfor -%}\n"
                    "{%- if add_generation_prompt -%}{{'<｜Assistant｜><think>\\n'}}"
                    "{% if not enable_thinking %}{{- '</think>' -}}{% endif %}\n{%- endif %}")
"""The generation prompt of models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja."""

LLAMA3_LIKE = ("{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + "
               "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}\n"
               "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n")


def _jinja(source: str, **settings) -> ChatTemplates:
    return ChatTemplates(TemplateSettings(chat_template=source, **settings), None)


def test_builtin_formats_are_llama_chat_cpp_s():
    chat = [("system", "Book"), ("user", " What is the best book "), ("assistant", "Dune")]
    assert builtin.apply("llama3", chat, True) == (
        "<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nDune<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert builtin.apply("command-r", chat[:2], True) == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Book<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is the best book<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    assert builtin.apply("chatml", chat[:2], False) == \
        "<|im_start|>system\nBook<|im_end|>\n<|im_start|>user\n What is the best book <|im_end|>\n"
    assert builtin.apply("llama2-sys", chat, True) == \
        "[INST] <<SYS>>\nBook\n<</SYS>>\n\n What is the best book  [/INST]Dune</s>"
    assert builtin.apply("orion", chat, True) == "Human: Book\n\n What is the best book \n\nAssistant: </s>Dune</s>"
    assert builtin.apply("granite", chat[1:], True) == (
        "<|start_of_role|>user<|end_of_role|> What is the best book <|end_of_text|>\n"
        "<|start_of_role|>assistant<|end_of_role|>Dune<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>")
    assert builtin.apply("gemma", chat, True) == ("<start_of_turn>user\nBook\n\nWhat is the best book<end_of_turn>\n"
                                                  "<start_of_turn>model\nDune<end_of_turn>\n<start_of_turn>model\n")


def test_builtin_family_is_found_by_name_or_by_markers_in_llama_cpp_s_order():
    assert builtin.detect("llama3") == "llama3"
    assert builtin.detect("{{ '<|im_start|>' }}{{ '<|im_sep|>' }}") == "phi4"
    assert builtin.detect("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>") == "command-r"
    assert builtin.detect("[INST] <<SYS>> {{ message.content.strip() }}") == "llama2-sys-strip"
    assert builtin.detect("<|start_header_id|>x<|end_header_id|>") == "llama3"
    assert builtin.detect("This is not a chat template, it is") is None


def test_no_jinja_refuses_a_template_it_does_not_know_and_renders_a_known_one():
    with pytest.raises(TemplateError, match="not supported"):
        ChatTemplates(TemplateSettings(chat_template="This is not a chat template, it is", jinja=False), None)
    templates = ChatTemplates(TemplateSettings(chat_template="llama3", jinja=False), None)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert templates.render(parts, options=ChatOptions(add_generation_prompt=False)) == \
        "<|start_header_id|>user<|end_header_id|>\n\na\nb<|eot_id|>"  # parts joined with a newline


def test_jinja_gets_llama_cpp_s_globals_filters_and_variables():
    source = ("{{ strftime_now('%Y') }}|{{ bos_token }}|{{ messages[0].content | tojson }}|"
              "{{ {'a': [1, 2]} | tojson(indent=2) }}|{{ {'a': 1} | tojson(separators=(',', ':')) }}|"
              "{{ 'x' + functions }}|{{ add_generation_prompt is defined }}|{{ date_string }}|{{ flavour }}")
    templates = ChatTemplates(TemplateSettings(chat_template=source, template_kwargs={"flavour": '"mint"'}), None,
                              bos_token="<s>")
    text = templates.render([{"role": "user", "content": "héllo <b>"}], options=ChatOptions(add_generation_prompt=False))
    today = datetime.date.today()
    assert text == (f'{today.year}|<s>|"héllo <b>"|{{\n  "a": [\n    1,\n    2\n  ]\n}}|{{"a":1}}|x|False|'
                    f'{today.strftime("%d %b %Y")}|mint')


def test_raise_exception_is_a_server_error_with_its_message():
    templates = _jinja("{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}ok")
    with pytest.raises(LlamaError) as caught:
        templates.render([{"role": "assistant", "content": "hi"}])
    assert caught.value.status == 500 and caught.value.message == "Jinja Exception: user first"


@pytest.mark.parametrize(("source", "reasoning", "end"), [
    (QWEN3_TAIL, "auto", "<|im_start|>assistant\n"),
    (QWEN3_TAIL, "off", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    (DEEPSEEK_R1_TAIL, "auto", "<｜Assistant｜><think>\n"),
    (DEEPSEEK_R1_TAIL, "on", "<｜Assistant｜><think>\n"),
    (DEEPSEEK_R1_TAIL, "off", "<｜Assistant｜><think>\n</think>"),
])
def test_reasoning_flag_and_template_support_decide_enable_thinking(source, reasoning, end):
    prompt = _jinja(source, reasoning=reasoning).render([{"role": "user", "content": "What is today?"}])
    assert prompt.endswith(end)


def test_a_final_assistant_message_is_continued_after_the_generation_prompt():
    templates = ChatTemplates(TemplateSettings(chat_template=LLAMA3_LIKE), None, bos_token="<s>")
    head = ("<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|><|start_header_id|>user<|end_header_id|>"
            "\n\nWhat is the best book<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    for prefill, text in (("Whill", "Whill"), ([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}],
                                               "Wh\n\nill")):
        body = {"messages": [*BOOK, {"role": "assistant", "content": prefill}]}
        assert templates.render(body["messages"], options=chat_options(body)) == head + text
    explicit = {"messages": [*BOOK, {"role": "assistant", "content": "Whill"}], "continue_final_message": True,
                "add_generation_prompt": False}
    assert templates.render(explicit["messages"], options=chat_options(explicit, prefill_assistant=False)) == \
        head + "Whill"
    closed = {"messages": [*BOOK, {"role": "assistant", "content": "Whill"}]}
    assert templates.render(closed["messages"], options=chat_options(closed, prefill_assistant=False)).endswith(
        "Whill<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_templates_without_system_role_or_typed_content_get_the_messages_they_can_read():
    source = "{% for m in messages %}{% if m.role != 'system' %}[{{ m.role }}:{{ m.content }}]{% endif %}{% endfor %}"
    templates = _jinja(source)
    assert templates.caps["supports_system_role"] is False and templates.caps["supports_typed_content"] is False
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert templates.render([{"role": "developer", "content": "Be brief"}, {"role": "user", "content": parts}]) == \
        "[user:Be brief\na\nb]"


def test_request_options_as_llama_server_reads_them():
    assert chat_options({"messages": [], "continue_final_message": "reasoning_content",
                         "add_generation_prompt": False}).continue_final == "reasoning"
    assert chat_options({"messages": [], "reasoning_effort": "none"}).enable_thinking is False
    assert chat_options({"messages": [], "chat_template_kwargs": {"enable_thinking": True}}).enable_thinking is True
    with pytest.raises(LlamaError, match="Unknown reasoning format: deep"):
        chat_options({"messages": [], "reasoning_format": "deep"})
    with pytest.raises(LlamaError, match='invalid type for "enable_thinking"'):
        chat_options({"messages": [], "chat_template_kwargs": {"enable_thinking": "yes"}})


def test_template_flags_parse_as_llama_server_s(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}")
    args = ["-m", "llama-3.2-1b-Q8_0.gguf", "--chat-template-file", str(path), "--no-jinja", "-rea", "off",
            "--chat-template-kwargs", '{"flavour": "mint"}', "--no-prefill-assistant", "--verbose"]
    config = config_from_args(build_parser().parse_args(args))
    assert (config.chat_template, config.jinja, config.reasoning, config.chat_template_kwargs,
            config.prefill_assistant, config.verbose) == ("{{ messages[0].content }}", False, "off",
                                                          (("flavour", '"mint"'),), False, True)
    for bad in (["--chat-template-file", str(tmp_path / "missing.jinja")], ["--reasoning", "maybe"],
                ["--chat-template-kwargs", "[1]"]):
        with pytest.raises(ServerConfigError):
            config_from_args(build_parser().parse_args(["-m", "llama-3.2-1b-Q8_0.gguf", *bad]))


async def test_server_renders_every_chat_route_with_its_template_and_shows_it_in_verbose_and_props():
    config = LlamaServerConfig(model="llama-3.2-1b-Q8_0.gguf", port=0, time_scale=0.01, chat_template=LLAMA3_LIKE,
                               verbose=True)
    running = await start_llama(config, cold_start=False)
    await running.wait_ready()
    base = f"http://127.0.0.1:{running.port}"
    try:
        async with aiohttp.ClientSession() as session:
            status, applied = await post_on(session, base + "/apply-template", {"messages": BOOK})
            assert status == 200 and applied["prompt"] == (  # the template's BOS left to the tokenizer
                "<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|><|start_header_id|>user"
                "<|end_header_id|>\n\nWhat is the best book<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
            status, chat = await post_on(session, base + "/v1/chat/completions", {"messages": BOOK, "max_tokens": 2})
            assert status == 200 and chat["__verbose"]["prompt"] == applied["prompt"]
            assert list(chat)[-2:] == ["__verbose", "timings"]
            _, quiet = await post_on(session, base + "/v1/chat/completions",
                                     {"messages": BOOK, "max_tokens": 2, "verbose": False})
            assert "__verbose" not in quiet
            status, both = await post_on(session, base + "/v1/chat/completions", {
                "messages": [*BOOK, {"role": "assistant", "content": "Hi"}], "continue_final_message": True})
            assert status == 400 and "add_generation_prompt" in both["error"]["message"]
            async with session.get(base + "/props") as resp:
                props = await resp.json()
            assert props["chat_template"] == LLAMA3_LIKE
            assert props["chat_template_caps"]["supports_system_role"] is True
    finally:
        await running.close()


async def test_no_jinja_server_refuses_tools_as_llama_server():
    config = LlamaServerConfig(model="llama-3.2-1b-Q8_0.gguf", port=0, time_scale=0.01, chat_template="chatml",
                               jinja=False)
    running = await start_llama(config, cold_start=False)
    await running.wait_ready()
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await post_on(session, f"http://127.0.0.1:{running.port}/apply-template",
                                         {"messages": BOOK, "tools": [tool]})
    finally:
        await running.close()
    assert status == 500 and body["error"]["message"] == "tools param requires --jinja flag"
    assert json.dumps(body["error"]["type"]) == '"server_error"'


async def test_streamed_chat_carries_verbose_on_its_first_closing_delta():
    config = LlamaServerConfig(model="llama-3.2-1b-Q8_0.gguf", port=0, time_scale=0.01, verbose=True)
    running = await start_llama(config, cold_start=False)
    await running.wait_ready()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{running.port}/v1/chat/completions",
                                    json={"messages": BOOK, "max_tokens": 3, "stream": True}) as resp:
                text = await resp.text()
    finally:
        await running.close()
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    carrying = [e for e in events if "__verbose" in e]
    assert len(carrying) == 1 and carrying[0]["choices"][0]["finish_reason"] is not None
    assert carrying[0]["__verbose"]["prompt"].startswith("<|im_start|>system\nBook<|im_end|>\n")


def test_tool_calls_reach_templates_that_read_object_arguments_as_objects():
    source = ("{% for m in messages %}{% for c in m.tool_calls or [] %}[{{ c.function.name }} "
              "{{ c.function.arguments | tojson }} {% for k, v in c.function.arguments | items %}{{ k }}={{ v }}"
              "{% endfor %}]{% endfor %}{% endfor %}{% for t in tools or [] %}<{{ t.function.name }}>{% endfor %}")
    templates = _jinja(source)
    assert templates.caps["supports_object_arguments"] and templates.caps["supports_tool_calls"]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    assert templates.render(messages, [tool]) == '[get_weather {"city": "Paris"} city=Paris]<get_weather>'
    bad = {**call, "function": {**call["function"], "arguments": "{not json"}}
    with pytest.raises(LlamaError, match="Failed to parse tool call arguments as JSON"):
        templates.render([messages[0], {**messages[1], "tool_calls": [bad]}])


def _gguf_with_template(path, template: str) -> None:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_block_count, 2), (writer.add_context_length, 2048), (writer.add_embedding_length, 64),
                       (writer.add_head_count, 4), (writer.add_head_count_kv, 2), (writer.add_file_type, 0)):
        add(value)
    writer.add_token_list([f"t{i}" for i in range(512)])
    writer.add_chat_template(template)
    writer.add_tensor("weights", np.zeros(1024, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


async def test_a_gguf_s_own_chat_template_is_the_default(tmp_path):
    path = tmp_path / "templated.gguf"
    _gguf_with_template(path, "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                              "{% if add_generation_prompt %}<assistant>{% endif %}")
    running = await start_llama(LlamaServerConfig(model=str(path), port=0, time_scale=0.01), cold_start=False)
    await running.wait_ready()
    try:
        async with aiohttp.ClientSession() as session:
            status, applied = await post_on(session, f"http://127.0.0.1:{running.port}/apply-template", {"messages": BOOK})
            async with session.get(f"http://127.0.0.1:{running.port}/props") as resp:
                props = await resp.json()
    finally:
        await running.close()
    assert status == 200 and applied["prompt"] == "<system>Book<user>What is the best book<assistant>"
    assert props["chat_template"].startswith("{% for m in messages %}<{{ m.role }}>")


def test_a_model_s_tool_use_variant_renders_requests_with_tools():
    templates = ChatTemplates(TemplateSettings(), "{{ 'plain:' + messages[0].content }}",
                              tool_use_template="{{ 'tools:' + tools[0].function.name }}")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert templates.render([{"role": "user", "content": "hi"}]) == "plain:hi"
    assert templates.render([{"role": "user", "content": "hi"}], [tool]) == "tools:f"
    assert templates.tool_use_props() == {"chat_template_tool_use": "{{ 'tools:' + tools[0].function.name }}"}
    overridden = ChatTemplates(TemplateSettings(chat_template="{{ 'mine' }}"), "x", tool_use_template="y")
    assert overridden.render([{"role": "user", "content": "hi"}], [tool]) == "mine" and not overridden.tool_use_props()
