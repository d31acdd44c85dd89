"""llama-server's error envelope {"error": {"code", "message", "type"}} and its request checks."""

from __future__ import annotations

import json

from aiohttp import web

from fake_engines.driver.serving import json_body

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


class LlamaError(Exception):
    """An error llama-server reports with its envelope."""

    def __init__(self, status: int, message: str, err_type: str | None = None, **extra: int) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type or TYPES[status]
        self.extra = extra

    def response(self) -> web.Response:
        """The HTTP response; routes answer {code, message, type}, 404/503 from the HTTP layer differ."""
        body = {"code": self.status, "message": self.message, "type": self.err_type, **self.extra}
        return json_body({"error": body}, self.status)


def not_found() -> web.Response:
    """httplib's 404 for unknown paths and methods (message/type/code order as captured)."""
    return json_body({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}, 404)


def loading() -> web.Response:
    """Every route while the model loads."""
    return json_body({"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}, 503,
                     headers={"Connection": "close"})


def parse_json(raw: bytes) -> dict:
    """The request JSON; nlohmann's parse errors are 500 server_error on llama-server."""
    if not raw.strip():
        raise LlamaError(500, "[json.exception.parse_error.101] parse error at line 1, column 1: attempting to "
                         "parse an empty input; check that your input string or stream contains the expected JSON")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        from fake_engines.llamacpp.json_errors import parse_error_message

        text = raw.decode("utf-8", errors="replace")
        message = parse_error_message(text) or f"[json.exception.parse_error.101] parse error: {exc}"
        raise LlamaError(500, message) from None
    if not isinstance(body, dict):
        raise LlamaError(400, "Request body must be a JSON object")
    return body


def typed(body: dict, name: str, kind: type, what: str):
    """A field that must have a JSON type (bool/number); nlohmann's type_error text."""
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, bool) if kind is bool else isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        actual = "string" if isinstance(value, str) else type(value).__name__
        raise LlamaError(400, f"Field '{name}': [json.exception.type_error.302] type must be {what}, but is {actual}")
    return value


def max_tokens(body: dict) -> int:
    """n_predict / max_tokens: -1 means unlimited; below -1 is refused."""
    value = body.get("n_predict", body.get("max_tokens", body.get("max_completion_tokens", -1)))
    value = typed({"max_tokens": value}, "max_tokens", float, "number")
    if value is None:
        return -1
    if value < -1:
        raise LlamaError(400, f"Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got "
                         f"{int(value)}")
    return int(value)
