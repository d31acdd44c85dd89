"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping

from aiohttp import web

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
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


ANTHROPIC_PATH = "/v1/messages"
"""Anthropic's Messages API (and its /count_tokens): errors there also say `"type": "error"`."""


def speaks_anthropic(path: str) -> bool:
    """The route is Anthropic's, whose clients read `{"type": "error", "error": {"type", "message"}}`."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def error_body(status: int, message: str, param: str | None = None, code: str | int | None = None,
               anthropic: bool = False) -> dict:
    """OpenAI's error object; for an Anthropic route the same object under Anthropic's envelope
    (`"type": "error"` beside it), so either kind of client reads `error.type` and `error.message`."""
    body: dict = {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                            "param": param, "code": code if code is not None else status}}
    return {"type": "error", **body} if anthropic else body


def error_response(exc: ProxyError, default_headers: Mapping[str, str] | None = None,
                   anthropic: bool = False) -> web.Response:
    """The error as JSON; headers set on the error win over `default_headers`."""
    headers = {**(default_headers or {}), **exc.headers}
    return web.Response(status=exc.status, headers=headers, content_type="application/json",
                        text=json.dumps(error_body(exc.status, exc.message, exc.param, exc.code, anthropic)))


def sse_error_event(message: str, status: int = 502, anthropic: bool = False) -> bytes:
    """The end of a stream that broke mid-way: an error event, then [DONE] (as vLLM does); on an
    Anthropic stream an `event: error` (as Anthropic and llama-server send it), no [DONE]."""
    payload = json.dumps(error_body(status, message, anthropic=anthropic))
    if anthropic:
        return f"event: error\ndata: {payload}\n\n".encode()
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()


class ThrottledWarning:
    """One warning line at most every `every_s` seconds, saying how many were held back, so no
    client can flood the log by repeating a request."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.every_s = every_s
        self.clock = clock
        self.last_s: float | None = None
        self.held_back = 0

    def warning(self, message: str) -> bool:
        """Log `message` (flattened to one line) unless one went out recently; True if it did."""
        now = self.clock()
        if self.last_s is not None and now - self.last_s < self.every_s:
            self.held_back += 1
            return False
        line = " ".join(message.split())
        if self.held_back and self.last_s is not None:  # held back only after a line went out
            line += f" ({self.held_back} more like it in the last {now - self.last_s:.0f} s)"
        self.logger.warning("%s", line)
        self.last_s, self.held_back = now, 0
        return True
