"""nlohmann::json's parse-error messages, which llama-server passes to clients of a malformed body.

`[json.exception.parse_error.101] parse error at line L, column C: syntax error while parsing
CONTEXT - unexpected TOKEN; expected TOKEN`, with nlohmann's token names and contexts (value,
object key, object separator, object, array) and its position: the column of the last character
read, end of input one past the last character (captures `llama.cpp/045`, `046`). A lexer error
(a bad literal, an unterminated string) reads `- invalid literal; last read: '...'` as nlohmann's
does for the common cases; its finer wordings (bad escapes, control characters) are not copied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAMES = {"{": "'{'", "}": "'}'", "[": "'['", "]": "']'", ":": "':'", ",": "','", "true": "'true'",
          "false": "'false'", "null": "'null'", "string": "string literal", "number": "number literal",
          "end": "end of input", "value": "'[', '{', or a literal"}
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')


@dataclass(frozen=True)
class _Token:
    kind: str
    """A _NAMES key, or "error" for a lexer error."""
    end: int
    """Index just past the token (what nlohmann has read)."""
    text: str = ""
    """The characters read, for a lexer error's `last read`."""
    error: str = ""
    """The lexer's message for an error token."""


class _Failure(Exception):
    def __init__(self, message: str, at: int) -> None:
        super().__init__(message)
        self.message, self.at = message, at


def _token(text: str, i: int) -> _Token:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    if i >= len(text):
        return _Token("end", len(text) + 1)
    ch = text[i]
    if ch in "{}[]:,":
        return _Token(ch, i + 1)
    if ch == '"':
        match = _STRING.match(text, i)
        if match:
            return _Token("string", match.end())
        return _Token("error", len(text) + 1, text[i:], "invalid string: missing closing quote")
    for word in ("true", "false", "null"):
        if text.startswith(word, i):
            return _Token(word, i + len(word))
        if ch == word[0]:  # nlohmann reads the literal until the first character that differs
            n = next(k for k in range(len(word)) if not text.startswith(word[:k + 1], i))
            read = text[i:i + n + 1]
            return _Token("error", i + len(read) + (i + n >= len(text)), read, "invalid literal")
    match = _NUMBER.match(text, i)
    if match and match.end() > i:
        return _Token("number", match.end())
    return _Token("error", i + 1, ch, "invalid literal")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def next(self) -> _Token:
        token = _token(self.text, self.at)
        self.at = token.end
        return token

    def fail(self, context: str, token: _Token, expected: str | None) -> _Failure:
        if token.kind == "error":  # a lexer error names no expected token where a value was due
            detail = f"{token.error}; last read: '{token.text}'"
            expected = expected if expected == "end" else None
        else:
            detail = f"unexpected {_NAMES[token.kind]}"
        tail = f"; expected {_NAMES[expected]}" if expected else ""
        return _Failure(f"syntax error while parsing {context} - {detail}{tail}", token.end)

    def value(self, token: _Token) -> None:
        if token.kind == "{":
            self.obj()
        elif token.kind == "[":
            self.array()
        elif token.kind not in ("string", "number", "true", "false", "null"):
            raise self.fail("value", token, "value")

    def obj(self) -> None:
        token = self.next()
        if token.kind == "}":
            return
        while True:
            if token.kind != "string":
                raise self.fail("object key", token, "string")
            token = self.next()
            if token.kind != ":":
                raise self.fail("object separator", token, ":")
            self.value(self.next())
            token = self.next()
            if token.kind == "}":
                return
            if token.kind != ",":
                raise self.fail("object", token, "}")
            token = self.next()

    def array(self) -> None:
        token = self.next()
        if token.kind == "]":
            return
        while True:
            self.value(token)
            token = self.next()
            if token.kind == "]":
                return
            if token.kind != ",":
                raise self.fail("array", token, "]")
            token = self.next()


def parse_error_message(text: str) -> str | None:
    """nlohmann's message for `text`, or None when nlohmann would parse it."""
    parser = _Parser(text)
    try:
        parser.value(parser.next())
        token = parser.next()
        if token.kind != "end":
            raise parser.fail("value", token, "end")
    except _Failure as failure:
        line = text.count("\n", 0, min(failure.at, len(text))) + 1
        start = text.rfind("\n", 0, min(failure.at, len(text))) + 1
        return f"[json.exception.parse_error.101] parse error at line {line}, column {failure.at - start}: " \
               f"{failure.message}"
    return None
