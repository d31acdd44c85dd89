"""Who may call what, as llama-server's pre-routing handler decides (tools/server/server-http.cpp),
before any route is looked up:

1. every answer gets `Access-Control-Allow-Origin`: the request's Origin echoed (the default:
   `--cors-origins *` with credentials; an absent Origin echoes as empty), only a localhost Origin
   (`--cors-origins localhost`, the default once built-in tools or MCP servers are on), or the
   configured value;
2. an OPTIONS request is a preflight: 200, empty, with the Allow-Credentials / -Methods / -Headers,
   whatever the path, the key or the loading state;
3. while the model loads every route but the web UI's answers 503 `Loading model`;
4. with API keys, every route but /health, /v1/health and the UI needs one: `Authorization`
   (the `Bearer ` prefix optional), else `X-Api-Key` (Anthropic clients); 401 otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from fake_engines.driver.serving import json_body
from fake_engines.factory.llamacpp_http_flags import api_keys
from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.errors import loading
from fake_engines.llamacpp.webui import UI_PATHS

PUBLIC_PATHS = frozenset({"/health", "/v1/health", *UI_PATHS})
"""Routes answered without an API key (llama-server's get_public_endpoints)."""


@dataclass(frozen=True)
class AccessPolicy:
    """The keys and CORS settings of one server."""

    api_keys: tuple[str, ...] = ()
    """Accepted keys; empty: no key needed."""
    cors_origins: str = "*"
    """`*`, `localhost` or the literal Access-Control-Allow-Origin value."""
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    """Access-Control-Allow-Methods of a preflight."""
    cors_headers: str = "*"
    """Access-Control-Allow-Headers of a preflight."""
    cors_credentials: bool = True
    """Access-Control-Allow-Credentials of a preflight; with `*` the Origin is echoed back."""

    @classmethod
    def of(cls, config: LlamaServerConfig) -> AccessPolicy:
        """The policy of a server's flags; with built-in tools or MCP servers on and no
        --cors-origins, only localhost origins (common/arg.cpp)."""
        tools_enabled = bool(config.server_tools or config.mcp_servers_config or config.mcp_servers_json)
        origins = config.cors_origins or ("localhost" if tools_enabled else "*")
        return cls(api_keys(config.api_key, config.api_key_file), origins, config.cors_methods,
                   config.cors_headers, not config.no_cors_credentials)

    def allow_origin(self, origin: str) -> str | None:
        """Access-Control-Allow-Origin for a request's Origin ("" when absent); None: no header."""
        if self.cors_credentials and self.cors_origins == "*":
            return origin
        if self.cors_origins == "localhost":
            return origin if origin and origin_is_localhost(origin) else None
        return self.cors_origins

    def preflight_headers(self) -> dict[str, str]:
        """What an OPTIONS answer adds to the origin header."""
        return {"Access-Control-Allow-Credentials": "true" if self.cors_credentials else "false",
                "Access-Control-Allow-Methods": self.cors_methods,
                "Access-Control-Allow-Headers": self.cors_headers}

    def admits(self, path: str, headers: Mapping[str, str]) -> bool:
        """True when the route is public, no key is set, or the request carries a valid key."""
        if not self.api_keys or path in PUBLIC_PATHS:
            return True
        key = headers.get("Authorization", "") or headers.get("X-Api-Key", "")
        return key.removeprefix("Bearer ") in self.api_keys


def origin_is_localhost(origin: str) -> bool:
    """True when the Origin's host is localhost, 127.0.0.1 or ::1 (any port); an Origin without an
    http(s) scheme is none (llama.cpp's common_http_parse_url refuses it)."""
    try:
        parts = urlsplit(origin)
        host = parts.hostname
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and host in ("localhost", "127.0.0.1", "::1")


def unauthorized() -> web.Response:
    """The 401 llama-server's key check answers (message, type, code in that order)."""
    return json_body({"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}, 401)


ACCESS_KEY = web.AppKey("llama_access", AccessPolicy)
READY_KEY: web.AppKey[Callable[[], bool]] = web.AppKey("llama_ready")


def install(app: web.Application, policy: AccessPolicy, is_ready: Callable[[], bool]) -> None:
    """Put the pre-routing checks first in `app` and the origin header on every answer."""
    app[ACCESS_KEY] = policy
    app[READY_KEY] = is_ready
    app.middlewares.insert(0, pre_routing)
    app.on_response_prepare.append(_allow_origin)


@web.middleware
async def pre_routing(request: web.Request, handler):
    """Preflight, loading, key: in llama-server's order, before the route is looked up."""
    policy = request.app[ACCESS_KEY]
    if request.method == "OPTIONS":
        return web.Response(text="", content_type="text/html", headers=policy.preflight_headers())
    if not request.app[READY_KEY]() and request.path not in UI_PATHS:
        return loading()
    if not policy.admits(request.path, request.headers):
        return unauthorized()
    return await handler(request)


async def _allow_origin(request: web.Request, response: web.StreamResponse) -> None:
    allowed = request.app[ACCESS_KEY].allow_origin(request.headers.get("Origin", ""))
    if allowed is not None:
        response.headers["Access-Control-Allow-Origin"] = allowed
