"""OpenAI-style JSON for requests that fail to parse as HTTP (oversized headers, bad request
lines), which aiohttp answers before any middleware runs, as plain text by default."""

from __future__ import annotations

import json
import logging

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from proxy.errors import error_body

log = logging.getLogger(__name__)

HEADERS_TOO_LARGE = 431


def parse_error_status(status: int, exc: BaseException | None) -> int:
    """431 for an over-long header line or field (RFC 6585), the status aiohttp chose otherwise."""
    if isinstance(exc, LineTooLong) and "request line" not in str(exc).lower():
        return HEADERS_TOO_LARGE
    return status


class JsonErrorRequestHandler(RequestHandler):
    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        log.debug("HTTP parse error from %s: %s", request.remote, exc)
        status = parse_error_status(status, exc)
        text = "Internal error in the proxy." if status == 500 else (message or "Bad request.").splitlines()[0]
        resp = web.Response(status=status, content_type="application/json",
                            text=json.dumps(error_body(status, text[:200])))
        resp.force_close()
        return resp


class JsonErrorServer(Server):
    def __call__(self) -> RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorAppRunner(web.AppRunner):
    """An AppRunner whose protocol-level errors are OpenAI-style JSON."""

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = JsonErrorServer  # same state, our handler factory
        return server
