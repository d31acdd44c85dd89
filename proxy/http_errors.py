"""OpenAI-style JSON for requests that fail to parse as HTTP (oversized headers, bad request
lines), which aiohttp answers before any middleware runs, as plain text by default.
proxy/server.py builds the proxy's connection handler on this one."""

from __future__ import annotations

import json
import logging

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from proxy.errors import ThrottledWarning, error_body

log = logging.getLogger(__name__)
escaped_warning = ThrottledWarning(log)

HEADERS_TOO_LARGE = 431


def parse_error_status(status: int, exc: BaseException | None) -> int:
    """431 for an over-long header line or field (RFC 6585), the status aiohttp chose otherwise."""
    if isinstance(exc, LineTooLong) and "request line" not in str(exc).lower():
        return HEADERS_TOO_LARGE
    return status


class JsonErrorRequestHandler(RequestHandler):
    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:  # something escaped the app's own error handling: one line, no traceback
            escaped_warning.warning(f"error answering a request from {request.remote}: "
                                    f"{type(exc).__name__}: {str(exc)[:200]!r}")
        else:
            log.debug("HTTP parse error from %s: %s", request.remote, exc)
        if request.writer.output_size > 0:  # the answer started: all that is left is to close
            raise ConnectionError("the response had started; the connection is closed instead")
        status = parse_error_status(status, exc)
        text = "Internal error in the proxy." if status == 500 else (message or "Bad request.").splitlines()[0]
        resp = web.Response(status=status, content_type="application/json",
                            text=json.dumps(error_body(status, text[:200])))
        resp.force_close()
        return resp
