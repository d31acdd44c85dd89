"""Which request targets the proxy accepts.

The proxy forwards a fixed allow-list of OpenAI API routes (its route table in `proxy.app`);
nothing else of an engine (its `/admin/*`, `/metrics`, `/version`, LoRA loading) is reachable
through it. A request target must also be canonical: after percent-decoding, no dot segments,
empty segments, backslashes, `;` parameters, control or non-ASCII characters, and no
percent-encoded `/`, `\\`, `%` or NUL. Other targets get 404 even when they would normalise to a
served route, because every check that looks at the path (API keys, scale-from-zero holds) and
every engine behind the proxy must see the very same path. Upstream requests are built from the
matched route's own path, never from the client's bytes.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from urllib.parse import unquote_to_bytes

from aiohttp import web

from proxy.errors import ProxyError

ENCODED_DELIMITER = re.compile(r"%(2f|5c|25|00)", re.IGNORECASE)
"""Percent-encoded `/`, `\\`, `%` and NUL: each changes the path's meaning once decoded."""
BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def path_problem(raw_path: str) -> str | None:
    """None when `raw_path` (the encoded path, without the query) is canonical, else why not (pure)."""
    if not raw_path.startswith("/"):
        return "the path must start with /"
    if ENCODED_DELIMITER.search(raw_path) or BAD_ESCAPE.search(raw_path):
        return "percent-encoded delimiters are not accepted"
    decoded = unquote_to_bytes(raw_path)
    if not decoded.isascii() or any(c < 0x20 or c == 0x7F for c in decoded):
        return "control and non-ASCII characters are not accepted"
    if b"\\" in decoded or b";" in decoded:
        return "backslashes and ;parameters are not accepted"
    segments = decoded.split(b"/")[1:]
    if any(s in (b"", b".", b"..") for s in segments[:-1]) or segments[-1] in (b".", b".."):
        return "dot segments and empty segments are not accepted"
    return None


@web.middleware
async def canonical_path_middleware(request: web.Request,
                                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                                    ) -> web.StreamResponse:
    """404 for a non-canonical target before any other check or handler sees it."""
    problem = path_problem(request.rel_url.raw_path)
    if problem is not None:
        raise ProxyError(404, f"No such route: {problem}.", code="route_not_found")
    return await handler(request)
