import pytest

from proxy.errors import ProxyError
from proxy.request_parse import check_content_type, load_json_object, parse_request, render_chat


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
])
def test_bad_fields_are_400_naming_the_field(body: dict, chat: bool, param: str) -> None:
    with pytest.raises(ProxyError) as exc:
        parse(body, chat)
    assert exc.value.status == 400 and exc.value.param == param


@pytest.mark.parametrize("raw", [b"", b"{bad", b"[1, 2]", b"\xff\xfe"])
def test_bodies_that_are_not_a_json_object_are_400(raw: bytes) -> None:
    with pytest.raises(ProxyError) as exc:
        load_json_object(raw)
    assert exc.value.status == 400


def test_content_types_other_than_json_are_415() -> None:
    check_content_type("application/json; charset=utf-8")
    check_content_type("")
    with pytest.raises(ProxyError) as exc:
        check_content_type("text/plain")
    assert exc.value.status == 415
