"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "bad_gateway_error",
    503: "unavailable_error",
    504: "timeout_error",
}


class ProxyError(Exception):
    """An answer the proxy gives itself instead of a backend's."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})


def error_body(status: int, message: str, param: str | None = None, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code if code is not None else status}}


def error_response(exc: ProxyError, default_headers: Mapping[str, str] | None = None) -> web.Response:
    """The error as JSON; headers set on the error win over `default_headers`."""
    headers = {**(default_headers or {}), **exc.headers}
    return web.Response(status=exc.status, headers=headers, content_type="application/json",
                        text=json.dumps(error_body(exc.status, exc.message, exc.param, exc.code)))


def sse_error_event(message: str, status: int = 502) -> bytes:
    """The end of a stream that broke mid-way: an error event, then [DONE] (as vLLM does)."""
    payload = json.dumps(error_body(status, message))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()
