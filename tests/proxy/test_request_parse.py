import pytest

from proxy.errors import ProxyError
from proxy.request_parse import (
    MAX_JSON_DEPTH,
    check_content_type,
    load_json_object,
    parse_request,
    render_chat,
)


def parse(body: dict, chat: bool = False, headers: dict | None = None, adapters: frozenset = frozenset()):
    return parse_request(body, chat, headers or {}, "x-session-id", 4.0, adapters)


def test_every_chat_message_is_rendered_in_order() -> None:
    text = render_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}])
    assert text == "<|system|>be brief\n<|user|>hi\n<|assistant|>hello"


def test_routing_view_of_a_completion() -> None:
    p = parse({"model": "sql-lora", "prompt": "x" * 40, "max_tokens": 16, "user": "u1", "stream": True},
              adapters=frozenset({"sql-lora"}))
    info = p.info
    assert (info.model, info.lora, info.prompt_tokens, info.max_tokens, info.session_key) == (
        "sql-lora", "sql-lora", 10, 16, "u1")
    assert p.stream


def test_session_header_wins_over_the_user_field_and_token_ids_count_exactly() -> None:
    info = parse({"prompt": [1, 2, 3], "user": "u1"}, headers={"x-session-id": "s9"}).info
    assert info.session_key == "s9" and info.prompt_token_ids == (1, 2, 3) and info.prompt_tokens == 3


@pytest.mark.parametrize("body,chat,param", [
    ({"model": "m"}, False, "prompt"),
    ({"model": "m", "messages": "hi"}, True, "messages"),
    ({"model": "m", "messages": []}, True, "messages"),
    ({"model": 3, "prompt": "x"}, False, "model"),
    ({"prompt": "x", "stream": "yes"}, False, "stream"),
    ({"prompt": "x", "max_tokens": -5}, False, "max_tokens"),
    ({"prompt": {"a": 1}}, False, "prompt"),
    ({"prompt": "x", "max_tokens": 2**40}, False, "max_tokens"),
    ({"prompt": "x", "max_completion_tokens": "8"}, False, "max_completion_tokens"),
    ({"prompt": "x", "stream": True, "stream_options": "usage"}, False, "stream_options"),
    ({"prompt": "x", "stream": True, "stream_options": [1]}, False, "stream_options"),
    ({"prompt": "x", "stream_options": {"include_usage": "yes"}}, False, "stream_options.include_usage"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, True, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": None}]}]},
     True, "messages[1].content[0].text"),
    ({"messages": [{"role": "user", "content": ["text"]}]}, True, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": 7}]}, True, "messages[0].content"),
    ({"messages": [{"role": ["user"], "content": "hi"}]}, True, "messages[0].role"),
])
def test_bad_fields_are_400_naming_the_field(body: dict, chat: bool, param: str) -> None:
    with pytest.raises(ProxyError) as exc:
        parse(body, chat)
    assert exc.value.status == 400 and exc.value.param == param


@pytest.mark.parametrize("raw", [b"", b"{bad", b"[1, 2]", b"\xff\xfe", b'{"a": ' + b"[" * 100_000])
def test_bodies_that_are_not_a_json_object_are_400(raw: bytes) -> None:
    with pytest.raises(ProxyError) as exc:
        load_json_object(raw)
    assert exc.value.status == 400


@pytest.mark.parametrize("raw,param", [
    (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", None),  # past the interpreter's recursion limit
    (b'{"a": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}", "a" + "[0]" * (MAX_JSON_DEPTH - 1)),
    (b'{"a": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}", "a" + "[0]" * (MAX_JSON_DEPTH - 1)),
    (b'{"temperature": 1e400}', "temperature"),
    (b'{"messages": [{"x": [1, -Infinity]}]}', "messages[0].x[1]"),
    (b'{"top_p": NaN}', "top_p"),
])
def test_deep_nesting_and_numbers_that_are_not_finite_are_400_naming_where(raw: bytes, param: str | None) -> None:
    with pytest.raises(ProxyError) as exc:
        load_json_object(raw)
    assert exc.value.status == 400 and exc.value.param == param


def test_a_body_nested_just_within_the_limit_is_taken() -> None:
    depth = MAX_JSON_DEPTH - 1
    body = load_json_object(b'{"a": ' + b"[" * depth + b"]" * depth + b'}')
    assert "a" in body


@pytest.mark.parametrize("raw", [
    b'{"prompt": "x\\u00e9\\ud83d\\ude00 \xc3\xa9", "n": 123456789012345678901234567890, "t": 0.1}',
    b'{"a": 1, "a": 2, "f": 9007199254740993.0, "g": 1.5e-320, "h": -0.0, "i": 1E2, "j": [true, null, {}]}',
    b'\xef\xbb\xbf{"p": "after a byte order mark"}',  # json alone takes these three
    b'{"p": "\\ud800"}',
    b'{"p": "\xed\xa0\x80"}',
])
def test_bodies_parse_to_the_values_json_gives(raw: bytes) -> None:
    import json  # the proxy parses with msgspec first, for speed; the values must be json's

    assert repr(load_json_object(raw)) == repr(json.loads(raw))


def test_nesting_up_to_the_limit_and_large_flat_arrays_are_fine() -> None:
    depth = MAX_JSON_DEPTH - 1  # the body object itself is the first level
    assert load_json_object(b'{"a": ' + b"[" * depth + b"]" * depth + b"}")
    assert len(load_json_object(b'{"prompt": [%s]}' % b", ".join([b"1"] * 100_000))["prompt"]) == 100_000


def test_content_parts_without_text_and_null_content_are_fine() -> None:
    text = render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                                     {"type": "text", "text": "hi"}]},
                        {"role": "assistant", "content": None, "tool_calls": []}])
    assert text == "<|user|>hi\n<|assistant|>"


def test_content_types_other_than_json_are_415() -> None:
    check_content_type("application/json; charset=utf-8")
    check_content_type("")
    with pytest.raises(ProxyError) as exc:
        check_content_type("text/plain")
    assert exc.value.status == 415


def test_anthropic_routing_view_renders_the_system_prompt_first_and_keys_sessions_by_user_id() -> None:
    from proxy.request_parse import parse_anthropic_request

    body = {"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "be brief"}],
            "metadata": {"user_id": "u7"}, "stream": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                      {"type": "image", "source": {"type": "url", "url": "x"}}]}]}
    p = parse_anthropic_request(body, {}, "x-session-id", 4.0)
    assert p.info.prompt == "<|system|>be brief\n<|user|>hi" and p.info.session_key == "u7" and p.stream
    assert p.info.prompt_tokens == 8 and p.info.max_tokens == 8
    assert parse_anthropic_request({**body, "system": "s"}, {}, "x-session-id", 4.0).info.prompt == "<|system|>s\n<|user|>hi"
    for bad, param in [({"system": 3}, "system"), ({"system": ["x"]}, "system[0]"), ({"messages": None}, "messages")]:
        with pytest.raises(ProxyError) as err:
            parse_anthropic_request({**body, **bad}, {}, "x-session-id", 4.0)
        assert err.value.status == 400 and err.value.param == param
