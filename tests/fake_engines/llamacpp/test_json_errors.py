"""nlohmann::json's parse-error wording and positions, as llama-server passes them on."""

from __future__ import annotations

import json

import pytest

from fake_engines.llamacpp.json_errors import parse_error_message

PREFIX = "[json.exception.parse_error.101] parse error at line "


@pytest.mark.parametrize(("text", "expected"), [
    ('{"model": "tiny-llama", "prompt": "hi", "max_tokens": 8',  # capture llama.cpp/045
     "1, column 56: syntax error while parsing object - unexpected end of input; expected '}'"),
    ('{"model": "tiny-llama", "messages": [}',  # capture llama.cpp/046
     "1, column 38: syntax error while parsing value - unexpected '}'; expected '[', '{', or a literal"),
    ('{"a" 1}', "1, column 6: syntax error while parsing object separator - unexpected number literal; expected ':'"),
    ("{1: 2}", "1, column 2: syntax error while parsing object key - unexpected number literal; expected string literal"),
    ('{"a": [1, 2}', "1, column 12: syntax error while parsing array - unexpected '}'; expected ']'"),
    ('{"a": tru}', "1, column 10: syntax error while parsing value - invalid literal; last read: 'tru}'"),
    ('{"a": 1} x', "1, column 10: syntax error while parsing value - invalid literal; last read: 'x'; expected end of input"),
    ('{\n  "a": }', "2, column 8: syntax error while parsing value - unexpected '}'; expected '[', '{', or a literal"),
])
def test_messages_name_the_context_the_token_and_what_was_expected(text, expected):
    assert parse_error_message(text) == PREFIX + expected


@pytest.mark.parametrize("text", ['{"a": 1}', "[1, 2.5e3, true, null]", '"x"', ' {"a": {"b": []}} '])
def test_json_python_parses_is_no_error(text):
    json.loads(text)
    assert parse_error_message(text) is None
