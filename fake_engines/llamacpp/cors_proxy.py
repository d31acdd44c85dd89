"""GET/POST /cors-proxy?url=URL: llama-server's experimental CORS proxy for its web UI's MCP client
(tools/server/server-cors-proxy.h, server_http_proxy in server-models.cpp), off unless
--ui-mcp-proxy (403 `feature_disabled` then).

It fetches URL for the client, so it keeps the real server's limits: http and https only, no
password in the URL, and none of the client's own headers (Authorization, Cookie, X-Api-Key ...)
go on: only those the client names `x-llama-server-proxy-header-NAME` are sent, as NAME, less
Accept-Encoding, Transfer-Encoding and Content-Length (Host names the target). The answer comes
back streamed with the target's status, its Content-Type and its headers less Server,
Transfer-Encoding, Content-Length, Keep-Alive and Access-Control-* (this server sets its own); a
target that cannot be reached is a 500 `proxy error: ...` in plain words, as cpp-httplib names it.
The proxy is as open as llama-server's: any host the server can reach, redirects followed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from fake_engines.driver.serving import json_body
from fake_engines.llamacpp.errors import LlamaError

HEADER_PREFIX = "x-llama-server-proxy-header-"
"""Request headers the client wants forwarded, by their name after the prefix."""
NOT_FORWARDED = frozenset({"accept-encoding", "transfer-encoding", "content-length"})
STRIPPED_FROM_ANSWER = frozenset({"server", "transfer-encoding", "content-length", "keep-alive",
                                  "content-type", "connection", "content-encoding"})
"""llama-server's should_strip_proxy_header plus what aiohttp sets itself (content-type goes apart,
the body arrives decoded)."""
TIMEOUT_S = 600
"""llama-server's read and write timeouts for the target."""


@dataclass(frozen=True)
class TargetUrl:
    """common_http_parse_url's parts."""

    scheme: str
    """http or https."""
    host: str
    """Without brackets for an IPv6 literal."""
    port: int
    """80 / 443 unless given."""
    path: str
    """From the first slash on, query included; / when absent."""
    password: str = ""
    """After user: in user:password@."""

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_target(url: str) -> TargetUrl:
    """llama.cpp's common_http_parse_url plus the proxy's checks; LlamaError as the real answers
    (500 server_error for what it throws as runtime_error, 400 for a port that is no number)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise LlamaError(500, "invalid URL: no scheme")
    if scheme not in ("http", "https"):
        raise LlamaError(500, f"unsupported URL scheme: {scheme}")
    auth, at, after = rest.partition("@")
    password = auth.partition(":")[2] if at else ""
    rest = after if at else rest
    authority, slash, path = rest.partition("/")
    host, port_text = _split_authority(authority)
    try:
        port = int(port_text) if port_text else (80 if scheme == "http" else 443)
    except ValueError:
        raise LlamaError(400, "stoi") from None
    if not host:
        raise LlamaError(500, "invalid target URL: missing host")
    if password:
        raise LlamaError(500, "authentication in target URL is not supported")
    return TargetUrl(scheme, host, port, "/" + path if slash else "/", password)


def _split_authority(authority: str) -> tuple[str, str]:
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise LlamaError(500, f"invalid IPv6 URL authority: {authority}")
        after = authority[close + 1:]
        return authority[1:close], after[1:] if after.startswith(":") else ""
    host, _, port = authority.partition(":")
    return host, port


def forwarded_headers(headers: Mapping[str, str], target: TargetUrl) -> dict[str, str]:
    """Only the explicitly named headers, under their own names; Host rewritten to the target."""
    out: dict[str, str] = {}
    for key, value in headers.items():
        name = key[len(HEADER_PREFIX):] if key.lower().startswith(HEADER_PREFIX) else ""
        if not name or name.lower() in NOT_FORWARDED:
            continue
        if name.lower() == "host":
            default_port = target.port == (80 if target.scheme == "http" else 443)
            bracketed = f"[{target.host}]" if ":" in target.host else target.host
            value = bracketed if default_port else f"{bracketed}:{target.port}"
        out[name] = value
    return out


def disabled() -> web.Response:
    """What /cors-proxy answers without --ui-mcp-proxy."""
    return json_body({"error": {"message": "this feature is disabled", "type": "feature_disabled"}}, 403)


async def cors_proxy(request: web.Request) -> web.StreamResponse:
    """Fetch `url` with the request's method and body; stream the answer back."""
    target = parse_target(request.query.get("url", ""))
    body = await request.read()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=TIMEOUT_S, sock_read=TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=True) as session:
            async with session.request(request.method, target.origin + target.path, data=body or None,
                                       headers=forwarded_headers(request.headers, target),
                                       skip_auto_headers={"Accept-Encoding", "Content-Type"}) as upstream:
                return await _relay(request, upstream)
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        return _proxy_error(exc)


async def _relay(request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    headers = {k: v for k, v in upstream.headers.items()
               if k.lower() not in STRIPPED_FROM_ANSWER and not k.lower().startswith("access-control-")}
    headers["X-Accel-Buffering"] = "no"
    content_type = upstream.headers.get("Content-Type", "application/json; charset=utf-8")
    if upstream.status in (204, 304):
        return web.Response(status=upstream.status, headers=headers)
    response = web.StreamResponse(status=upstream.status, headers={**headers, "Content-Type": content_type})
    await response.prepare(request)
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    except (aiohttp.ClientError, TimeoutError):
        response.force_close()  # the target broke off: so does this answer, as httplib's reader stops
        return response
    await response.write_eof()
    return response


def _proxy_error(exc: BaseException) -> web.Response:
    """cpp-httplib's error names, after "proxy error: ", with status 500 (the body is not JSON,
    as llama-server sends it)."""
    reason = "Connection timed out" if isinstance(exc, TimeoutError) else "Could not establish connection"
    return web.Response(status=500, text=f"proxy error: {reason}",
                        headers={"Content-Type": "application/json; charset=utf-8"})


def add_cors_proxy_routes(app: web.Application, enabled: bool) -> None:
    """GET and POST /cors-proxy: the proxy, or 403 without --ui-mcp-proxy."""
    async def off(request: web.Request) -> web.Response:
        return disabled()
    handler = cors_proxy if enabled else off
    app.router.add_get("/cors-proxy", handler, allow_head=False)
    app.router.add_post("/cors-proxy", handler)
